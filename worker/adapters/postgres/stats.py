"""The replica's minute stats (table timer_stats), what the console charts: what /metrics' counters
gained, added every STATS_EVERY_S. A failed write is only logged: stats never stop a replica."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker import metrics
from worker.adapters.postgres.queries import QUERIES
from worker.core.waiting import wait_any

log = logging.getLogger(__name__)

STATS_EVERY_S = 15.0
STATS_KEEP = timedelta(days=7)
# Writes between two retention deletes: about every 10 minutes per replica.
TRIM_EVERY = 40


def _counter(counter: Any) -> float:
    """A counter's total over all its labels, as /metrics would sum it."""
    return float(sum(s.value for m in counter.collect() for s in m.samples if s.name.endswith("_total")))


def _buckets(histogram: Any) -> tuple[list[float], list[float]]:
    """(upper bounds, cumulative counts) of a histogram without labels; +Inf left out."""
    bounds, counts = [], []
    for m in histogram.collect():
        for s in m.samples:
            if s.name.endswith("_bucket") and s.labels["le"] != "+Inf":
                bounds.append(float(s.labels["le"]))
                counts.append(s.value)
    return bounds, counts


class StatsRollup:
    def __init__(
        self, pool: AsyncConnectionPool[Any], worker_id: str, every_s: float = STATS_EVERY_S
    ) -> None:
        self.pool = pool
        self.worker_id = worker_id
        self.every_s = every_s
        self.writes = 0
        # What was written already: each write adds what the counters gained since.
        self._fired = _counter(metrics.FIRED)
        self._rejected = _counter(metrics.COMMANDS_REJECTED)
        self._lateness = _buckets(metrics.LATENESS_SECONDS)[1]

    async def write(self) -> None:
        fired, rejected = _counter(metrics.FIRED), _counter(metrics.COMMANDS_REJECTED)
        bounds, cumulative = _buckets(metrics.LATENESS_SECONDS)
        gained = [now - before for now, before in zip(cumulative, self._lateness, strict=True)]
        per_bucket = [int(c - p) for c, p in zip(gained, [0.0, *gained[:-1]], strict=True)]
        params = {
            "worker_id": self.worker_id,
            "fired": int(fired - self._fired),
            "rejected": int(rejected - self._rejected),
            "overdue": int(metrics.OVERDUE._value.get()),
            "lateness_le": bounds,
            "lateness": per_bucket,
        }
        async with self.pool.connection() as conn:
            await conn.execute(QUERIES["stats_add"], params)
            if self.writes % TRIM_EVERY == 0:
                await conn.execute(QUERIES["stats_trim"], {"keep": STATS_KEEP})
        self._fired, self._rejected, self._lateness = fired, rejected, cumulative
        self.writes += 1

    async def run(self, stop: asyncio.Event) -> None:
        """Writes at once (`status` counts running replicas by these rows), every every_s, and at stop."""
        while True:
            try:
                await self.write()
            except (psycopg.Error, OSError) as exc:  # Postgres away: readiness says so already
                log.warning("stats not written", extra={"action": "stats_failed", "error": str(exc)})
            if stop.is_set():
                return
            await wait_any(self.every_s, stop)
