"""Retention (docs/USING.md, Retention): delete Reached, Expired and Cancelled timers past TIMER_RETENTION.

Every replica sweeps, at start and then about once a minute. A sweep deletes in small batches
(one short statement each, rows locked with SKIP LOCKED so replicas never wait on each other or on
intake) until a batch comes back short. Scheduled rows are never touched, and settings refuse a
retention shorter than the command redelivery horizon (TIMER_COMMAND_MAX_AGE): a Reached row
outlives every copy of the command that created it, so a late duplicate ScheduleTimer finds it and
is ignored instead of re-arming the timer.
"""

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

# Rows per DELETE: a few milliseconds of locks and WAL, however large the backlog.
BATCH = 2000
# Rows of the quota's counts folded per statement.
FOLD_BATCH = 20_000
# Between sweeps; plus up to JITTER_S, so replicas started together drift apart.
INTERVAL_S = 60.0
JITTER_S = 15.0


class Retention:
    def __init__(self, store: FinishedTimers, retention: timedelta, batch: int = BATCH) -> None:
        self.store = store
        self.retention = retention
        self.batch = batch

    async def sweep(self, stop: asyncio.Event | None = None) -> int:
        """Delete every expired finished row, batch after batch; how many went."""
        total = 0
        while stop is None or not stop.is_set():
            deleted = await self.store.delete_finished(self.retention, self.batch)
            total += deleted
            metrics.RETENTION_DELETED.inc(deleted)
            if deleted < self.batch:  # a short batch: nothing more is due (or the rest is locked)
                break
        # Expiry decisions (worker/core/expiry.py) outlive their occurrence until here.
        while (stop is None or not stop.is_set()) and await self.store.delete_decided(
            self.batch
        ) == self.batch:
            pass
        # The quota's bounds (migration 0014) gain a row per statement that makes timers of a
        # tenant pending, the quota on or off; intake folds the rows of the tenants it checks, and
        # this the rest, so the table stays about a row per tenant.
        while (stop is None or not stop.is_set()) and await self.store.compact_pending(
            FOLD_BATCH
        ) == FOLD_BATCH:
            pass
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Until stop: sweep, then wait about INTERVAL_S. A failed sweep waits for the next one."""
        while not stop.is_set():
            try:
                deleted = await self.sweep(stop)
            except TransientError as exc:  # Postgres away or read-only: try next time
                log.warning("retention sweep failed", extra={"action": "retention_failed", "error": str(exc)})
            else:
                if deleted:
                    log.info("retention sweep", extra={"action": "retention_swept", "count": deleted})
            await wait_any(INTERVAL_S + random.uniform(0, JITTER_S), stop)
