"""When the firing loop should next look at the database.

The database decides what is due (its clock, its rows). A replica only needs to know when to
ask again: the claim statement tells it how far away the next occurrence is, and intake (local
or on another replica, through a core-NATS hint) tells it when a sooner one was just stored.
A replica's own wall clock is never used. Its monotonic clock measures intervals, and the
database clock is estimated from every claim's reading of clock_timestamp() (worker/clock.py),
never ahead of it. That is what lets firing wait for a claimed-ahead occurrence without firing
it early.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

from worker.clock import DbClock


class Wakeup:
    def __init__(self, lead_s: float = 0.0, clock: DbClock | None = None) -> None:
        self.lead_s = lead_s  # hints wake this much before the due time (the claims' reach)
        self._event = asyncio.Event()
        self._target: float | None = None  # time.monotonic() to wake at
        self.clock = clock or DbClock()

    def observe_db_now(self, db_now: datetime) -> None:
        """A reading of the database clock, just received."""
        self.clock.observe(db_now)

    def db_now(self) -> float:
        """The database clock, in epoch seconds: never ahead of it, at most a reading's delay behind."""
        return self.clock.now()

    def hint(self, due_epoch_s: float) -> None:
        """Something comes due at this database-clock time: wake in time to claim it."""
        at = time.monotonic() + max(0.0, due_epoch_s - self.lead_s - self.db_now())
        if self._target is None or at < self._target:
            self._target = at
            self._event.set()

    async def sleep(self, seconds: float, stop: asyncio.Event) -> None:
        """Sleep up to `seconds`, less if a hint asks for an earlier wake-up or stop is set."""
        target = time.monotonic() + seconds
        if self._target is not None:
            target = min(target, self._target)
        self._target = target
        while not stop.is_set():
            remaining = self._target - time.monotonic()
            if remaining <= 0:
                break
            self._event.clear()
            waiters = [asyncio.ensure_future(self._event.wait()), asyncio.ensure_future(stop.wait())]
            _, pending = await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            for w in pending:
                w.cancel()
        self._target = None
