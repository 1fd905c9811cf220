"""A consumer outside the service that records what it publishes; one for all, so all measure alike."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, Protocol, TypeVar

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from worker.client.consumer import due_events
from worker.contract import Subjects

T = TypeVar("T")


class Received(Protocol):
    """A message as `keep` sees it: a nats-py Msg, or the client's DueEvent."""

    @property
    def subject(self) -> str: ...

    @property
    def data(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Firing:
    """One DueTimeReached as received."""

    msg_id: str
    tenant_id: str
    service_call_id: str
    due_at: float  # epoch seconds
    reached_at: float  # on the replica's database-clock estimate
    received_at: float  # this process's clock
    planned_at: float | None = None

    @classmethod
    def of(cls, received_at: float, msg: Received) -> Firing:
        body = json.loads(msg.data)
        p = body["payload"]
        due, reached = (datetime.fromisoformat(p[k]).timestamp() for k in ("dueAt", "reachedAt"))
        planned = datetime.fromisoformat(p["plannedAt"]).timestamp() if "plannedAt" in p else due
        return cls(body["id"], p["tenantId"], p["serviceCallId"], due, reached, received_at, planned)


class Recorder(Generic[T]):
    """Every message stored on `subject` in `stream`, as `keep(receive time, message)` makes it.

    Through an ordered consumer, which neither skips nor repeats across faults. With `durable`,
    through the client's due_events, as a user's consumer would (a record may then repeat).
    """

    def __init__(
        self,
        nats_: str | NATS,
        subject: str,
        stream: str,
        keep: Callable[[float, Received], T],
        durable: str | None = None,
    ) -> None:
        self.subject, self.stream, self.keep, self.durable = subject, stream, keep, durable
        self.records: list[T] = []
        self._url = nats_ if isinstance(nats_, str) else None
        self._nc = None if isinstance(nats_, str) else nats_
        self._receiving: asyncio.Task[None] | None = None

    async def start(self) -> None:
        if self._url is not None:
            self._nc = await nats.connect(
                self._url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2
            )
        assert self._nc is not None
        js = self._nc.jetstream()
        if self.durable is None:
            await js.subscribe(self.subject, cb=self._on_msg, ordered_consumer=True, stream=self.stream)
            return
        events = due_events(
            js, self.subject, durable=self.durable, stream=self.stream, ack_every=256, max_ack_pending=4096
        )

        async def receive() -> None:
            async for event in events:
                self.records.append(self.keep(time.time(), event))
                event.ack()

        self._receiving = asyncio.create_task(receive())

    async def _on_msg(self, msg: Msg) -> None:
        self.records.append(self.keep(time.time(), msg))

    async def stop(self) -> None:
        """Closes the connection it opened, not one it was given."""
        if self._receiving is not None:
            self._receiving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._receiving
        if self._url is not None and self._nc is not None:
            await self._nc.close()
            self._nc = None


class EventRecorder(Recorder[Firing]):
    """Every DueTimeReached of `tenant` (every tenant by default) under this subject prefix."""

    def __init__(
        self, nats_: str | NATS, prefix: str, stream: str, tenant: str = "*", durable: str | None = None
    ) -> None:
        super().__init__(nats_, Subjects(prefix).due(tenant), stream, Firing.of, durable)

    @property
    def firings(self) -> list[Firing]:
        return self.records

    def keys(self) -> Counter[tuple[str, str]]:
        """How often each (tenant, serviceCallId) fired."""
        return Counter((f.tenant_id, f.service_call_id) for f in self.records)

    async def wait_for(self, expected: int | set[tuple[str, str]], timeout: float) -> bool:
        """Until these timers (or this many distinct ones) fired, or the timeout; whether they did."""

        def done() -> bool:
            fired = self.keys()
            return len(fired) >= expected if isinstance(expected, int) else expected <= fired.keys()

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return True
            await asyncio.sleep(0.05)
        return done()
