"""The producer client. Imports only the contract, itself, nats-py and, if installed, OpenTelemetry.

producer.py     TimerClient: schedule, cancel, pause, resume, get, the bulk sends
errors.py       what `get` raises
consumer.py     due_events: the DueTimeReached consumer
acks.py         what due_events owes the server: acks not yet sent, events given out
pulls.py        the pull requests of due_events
envelopes.py    command envelopes, built in bulk
wire.py         every nats-py internal relied on
batches.py      the atomic and fast-ingest batch protocols
closing.py      a connection closed within a bound
tracecontext.py the caller's OpenTelemetry trace context as command headers
"""

from worker.client.batches import Sent
from worker.client.errors import GetRefused, GetTimeout, NoReplica, TimerClientError
from worker.client.producer import FastIngest, TimerClient

__all__ = ["FastIngest", "GetRefused", "GetTimeout", "NoReplica", "Sent", "TimerClient", "TimerClientError"]
