"""When the firing loop should next look at the database.

The database decides what is due (its clock, its rows). A replica only needs to know when to
ask again: the claim statement tells it how far away the next occurrence is, and intake (local
or on another replica, through a core-NATS hint) tells it when a sooner one was just stored.
Wakeup never reads the replica's wall clock. Its monotonic clock measures intervals, and the
database clock is estimated from every claim's reading of clock_timestamp() (worker/core/clock.py),
never ahead of it. Wakeup only schedules: what time it is on the database clock, and whether an
occurrence may be published yet, is the clock's business. (Intake checks a command's horizon,
TIMER_MAX_HORIZON, against the wall clock: that check is about years, not seconds.)
"""

from __future__ import annotations

import asyncio
import time

from worker.core.clock import Clock
from worker.core.waiting import wait_any


class Wakeup:
    def __init__(self, clock: Clock, lead_s: float = 0.0) -> None:
        self.clock = clock  # converts a hint's database-clock time to a wake-up on ours
        self.lead_s = lead_s  # hints wake this much before the due time (the claims' reach)
        self._event = asyncio.Event()
        self._target: float | None = None  # time.monotonic() to wake at

    def hint(self, due_epoch_s: float) -> None:
        """Something comes due at this database-clock time: wake in time to claim it."""
        at = time.monotonic() + max(0.0, due_epoch_s - self.lead_s - self.clock.now())
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
            await wait_any(remaining, self._event, stop)
        self._target = None
