"""When the firing loop should next look at the database.

The database decides what is due (its clock, its rows). A replica only needs to know when to
ask again: the claim statement tells it how far away the next occurrence is, and intake (local
or on another replica, through a core-NATS hint) tells it when a sooner one was just stored.
Wakeup never reads the replica's wall clock. Its monotonic clock measures intervals, and the
database clock is estimated from every claim's reading of clock_timestamp() (worker/core/clock.py),
never ahead of it. Wakeup only schedules: what time it is on the database clock, and whether an
occurrence may be published yet, is the clock's business. (Intake checks a command's horizon,
TIMER_MAX_HORIZON, against the wall clock: that check is about years, not seconds.)

A hint from another replica comes on a core-NATS subject, and what comes there is untrusted: a
JetStream consumer pointed at it redelivered a tenant's DLQ entries there by the thousand, each
one a claim. Such hints wake the loop at most once per PEER_HINT_SPACING_S (one extra claim per
interval, whatever the flood); one that would wake it sooner moves to the end of the interval.
The replica that stored a timer wakes itself with a direct hint, never limited, so the limit
only delays the other replicas joining in.
"""

from __future__ import annotations

import asyncio
import time

from worker.core.clock import Clock
from worker.core.waiting import wait_any

# How often hints from other replicas may wake the loop early: the claims' reach (LOOKAHEAD_MS),
# so a flood costs at most ten extra claims a second, and a timer a peer hinted at is claimed
# here at most that much later (the replica that stored it claims it at once).
PEER_HINT_SPACING_S = 0.1


class Wakeup:
    def __init__(self, clock: Clock, lead_s: float = 0.0) -> None:
        self.clock = clock  # converts a hint's database-clock time to a wake-up on ours
        self.lead_s = lead_s  # hints wake this much before the due time (the claims' reach)
        self._event = asyncio.Event()
        self._target: float | None = None  # time.monotonic() to wake at
        self._peer_next = 0.0  # time.monotonic() before which no peer's hint may wake the loop

    def hint(self, due_epoch_s: float) -> None:
        """Something comes due at this database-clock time: wake in time to claim it."""
        self._wake_at(self._due_at(due_epoch_s))

    def peer_hint(self, due_epoch_s: float) -> bool:
        """A hint from another replica (the wake subject): as hint(), but waking the loop no
        sooner than PEER_HINT_SPACING_S after the last wake-up a peer's hint set. False when the
        limit held it back: the caller counts it. `due_epoch_s` is finite (the caller checks)."""
        wanted = self._due_at(due_epoch_s)
        at = max(wanted, self._peer_next)
        if self._wake_at(at):
            self._peer_next = at + PEER_HINT_SPACING_S
        return at == wanted

    def _due_at(self, due_epoch_s: float) -> float:
        return time.monotonic() + max(0.0, due_epoch_s - self.lead_s - self.clock.now())

    def _wake_at(self, at: float) -> bool:
        """Wake at `at` if that is sooner than planned; whether it was."""
        if self._target is None or at < self._target:
            self._target = at
            self._event.set()
            return True
        return False

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
