"""When the firing loop should next look at the database. The database decides what is due; a replica
only learns when to ask again: from each claim (how far the next occurrence is) and from intake's
hints. Hints from other replicas arrive on core NATS and are untrusted, so they wake the loop at most
once per PEER_HINT_SPACING_S; a replica's own hints are never limited."""

from __future__ import annotations

import asyncio
import time

from worker.core.clock import Clock
from worker.core.waiting import wait_any

# A flood of peer hints costs at most one extra claim per claims' reach.
PEER_HINT_SPACING_S = 0.1


class Wakeup:
    def __init__(self, clock: Clock, lead_s: float = 0.0) -> None:
        self.clock = clock  # converts a hint's database-clock time to a wake-up on ours
        self.lead_s = lead_s  # hints wake this much before the due time (the claims' reach)
        self._event = asyncio.Event()
        self._target: float | None = None
        self._peer_next = 0.0

    def hint(self, due_epoch_s: float) -> None:
        """Something comes due at this database-clock time: wake in time to claim it."""
        self._wake_at(self._due_at(due_epoch_s))

    def peer_hint(self, due_epoch_s: float) -> bool:
        """As hint(), but no sooner than PEER_HINT_SPACING_S after the last peer wake-up; False when
        held back."""
        wanted = self._due_at(due_epoch_s)
        at = max(wanted, self._peer_next)
        if self._wake_at(at):
            self._peer_next = at + PEER_HINT_SPACING_S
        return at == wanted

    def _due_at(self, due_epoch_s: float) -> float:
        return time.monotonic() + max(0.0, due_epoch_s - self.lead_s - self.clock.now())

    def _wake_at(self, at: float) -> bool:
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
