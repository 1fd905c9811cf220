"""The producer client: TimerClient, its consumer, its envelopes and the NATS wire it owns."""

from worker.client.producer import FastIngest, Sent, TimerClient

__all__ = ["FastIngest", "Sent", "TimerClient"]
