"""When the firing loop should next look at the database.

The database decides what is due (its clock, its rows). A replica only needs to know when to
ask again: the claim statement tells it how far away the next occurrence is, and intake (local
or on another replica, through a core-NATS hint) tells it when a sooner one was just stored.
A replica's own wall clock is never used. Its monotonic clock measures intervals, and its
offset to the database clock is estimated from every claim's reading of clock_timestamp(): a
reading taken before it arrived can only be behind the database clock at arrival, so the
largest offset seen is a lower bound, and an estimate built on it is never ahead of the
database. That is what lets firing wait for a claimed-ahead occurrence without firing it early.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime

# Offsets are kept per window of this length, so the estimate follows the database clock's
# (tiny) drift against this machine's monotonic clock.
OFFSET_WINDOW_S = 60.0


class Wakeup:
    def __init__(self, lead_s: float = 0.0) -> None:
        self.lead_s = lead_s  # hints wake this much before the due time (the claims' reach)
        self._event = asyncio.Event()
        self._target: float | None = None  # time.monotonic() to wake at
        # Database clock minus time.monotonic(): the largest of this window and the last.
        self._offset_s = time.time() - time.monotonic()  # a first guess until a claim reads the clock
        self._window = (-float("inf"), -float("inf"))
        self._window_start = time.monotonic()

    def observe_db_now(self, db_now: datetime) -> None:
        """A reading of the database clock, just received: tighten the offset's lower bound."""
        now = time.monotonic()
        sample = db_now.timestamp() - now
        previous, current = self._window
        if now - self._window_start > OFFSET_WINDOW_S:
            previous, current, self._window_start = current, sample, now
        self._window = (previous, max(current, sample))
        self._offset_s = max(self._window)

    def db_now(self) -> float:
        """The database clock, in epoch seconds: never ahead of it, at most a reading's delay behind."""
        return time.monotonic() + self._offset_s

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
