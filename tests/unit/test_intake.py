"""The intake loop outlives NATS trouble: what a fetch raises is logged and the loop goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
import nats.js.errors

from worker.config import load_settings
from worker.core.intake import Intake


class FlakySubscription:
    """Fails each fetch with the next error; then stops the loop."""

    def __init__(self, errors: list[Exception], stop: asyncio.Event) -> None:
        self.errors, self.stop, self.fetches = errors, stop, 0
        self.unsubscribed = False

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.fetches += 1
        if self.errors:
            raise self.errors.pop(0)
        self.stop.set()
        return []

    async def unsubscribe(self) -> None:  # intake lets go of its subscription when it stops
        self.unsubscribed = True


class Broker:
    def __init__(self, sub: FlakySubscription) -> None:
        self.sub = sub
        self.checks = 0

    async def command_subscription(self) -> FlakySubscription:
        return self.sub

    def check_streams_soon(self) -> None:
        self.checks += 1


async def test_intake_survives_a_stream_without_leader_and_a_reconnect() -> None:
    stop = asyncio.Event()
    errors: list[Exception] = [
        nats.js.errors.ServiceUnavailableError(),  # the consumer's leader is being re-elected
        nats.errors.ConnectionReconnectingError(),
        nats.errors.TimeoutError(),
    ]
    sub = FlakySubscription(errors, stop)
    broker = Broker(sub)
    intake = Intake(load_settings(), store=None, broker=broker, wakeup=None, clock=None)  # type: ignore[arg-type]
    await asyncio.wait_for(intake.run(stop), timeout=10)
    assert sub.fetches == 4
    assert broker.checks == 2, "a 503 may be a deleted consumer: each failure has the streams checked"
    assert sub.unsubscribed, "a stopped intake lets go of its subscription, so the drain is quick"
