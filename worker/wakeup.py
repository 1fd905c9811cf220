"""When the firing loop should next look at the database.

The database decides what is due (its clock, its rows). A replica only needs to know when to
ask again: the claim statement tells it how far away the next occurrence is, and intake (local
or on another replica, through a core-NATS hint) tells it when a sooner one was just stored.
A replica's own clock is used only to measure short intervals, never to decide due-ness; its
offset to the database clock is re-estimated on every claim, so a skewed clock does no harm.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime


class Wakeup:
    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._target: float | None = None  # time.monotonic() to wake at
        self._offset_s = 0.0  # database clock minus this replica's wall clock

    def observe_db_now(self, db_now: datetime) -> None:
        self._offset_s = db_now.timestamp() - time.time()

    def db_now(self) -> float:
        """An estimate of the database clock, in epoch seconds."""
        return time.time() + self._offset_s

    def hint(self, due_epoch_s: float) -> None:
        """Something comes due at this database-clock time: wake no later than then."""
        at = time.monotonic() + max(0.0, due_epoch_s - self.db_now())
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
