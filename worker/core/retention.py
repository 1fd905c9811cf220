"""Retention (docs/USING.md, Retention): delete Reached, Expired and Cancelled timers past
TIMER_RETENTION, in small SKIP LOCKED batches so nobody waits. Retention outlives the command
redelivery horizon, so a late duplicate ScheduleTimer finds its Reached row and is ignored."""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import timedelta

from worker import metrics
from worker.core.ports import FinishedTimers
from worker.core.waiting import wait_any
from worker.errors import TransientError

log = logging.getLogger(__name__)

# A few milliseconds of locks and WAL per DELETE, however large the backlog.
BATCH = 2000
FOLD_BATCH = 20_000
# plus up to JITTER_S, so replicas started together drift apart.
INTERVAL_S = 60.0
JITTER_S = 15.0


class Retention:
    def __init__(self, store: FinishedTimers, retention: timedelta, batch: int = BATCH) -> None:
        self.store = store
        self.retention = retention
        self.batch = batch

    async def sweep(self, stop: asyncio.Event | None = None) -> int:
        total = 0
        while stop is None or not stop.is_set():
            deleted = await self.store.delete_finished(self.retention, self.batch)
            total += deleted
            metrics.RETENTION_DELETED.inc(deleted)
            if deleted < self.batch:  # a short batch: nothing more is due (or the rest is locked)
                break
        while (stop is None or not stop.is_set()) and await self.store.delete_decided(
            self.batch
        ) == self.batch:
            pass
        # The quota's bounds gain a row per statement; folding keeps about a row per tenant.
        while (stop is None or not stop.is_set()) and await self.store.compact_pending(
            FOLD_BATCH
        ) == FOLD_BATCH:
            pass
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Until stop: sweep, then wait about INTERVAL_S; a failed sweep waits for the next one."""
        while not stop.is_set():
            try:
                deleted = await self.sweep(stop)
            except TransientError as exc:  # Postgres away or read-only: try next time
                log.warning("retention sweep failed", extra={"action": "retention_failed", "error": str(exc)})
            else:
                if deleted:
                    log.info("retention sweep", extra={"action": "retention_swept", "count": deleted})
            await wait_any(INTERVAL_S + random.uniform(0, JITTER_S), stop)
