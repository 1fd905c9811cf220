"""The fleet over time, from the replicas' minute stats (table timer_stats, worker/adapters/
postgres/stats.py): fires per second, lateness p50 and p99 (a minute's, and the last five
minutes'), overdue and rejections a minute, and the replicas that wrote lately. For the console's
charts and `status`; plain data, on an open connection."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.stats import STATS_EVERY_S

# A replica that has not written its stats for this long is not listed as alive (it writes every
# 15 s: three missed writes).
ALIVE_S = 45.0


@dataclass(frozen=True, slots=True)
class Minute:
    at: datetime
    fires_per_s: float
    rejected: int
    overdue: int
    p50_s: float | None
    p99_s: float | None
    replicas: int
    # The minute's lateness histogram, all replicas added up: firings per bucket of `bounds`.
    bounds: tuple[float, ...] = ()
    counts: tuple[int, ...] = ()


def quantile(bounds: list[float], counts: list[int], q: float) -> float | None:
    """The q-quantile of a histogram (per-bucket counts), interpolated inside its bucket as
    Prometheus's histogram_quantile does; None without observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank, seen, lower = q * total, 0, 0.0
    for upper, n in zip(bounds, counts, strict=True):
        if n and seen + n >= rank:
            return lower + (upper - lower) * (rank - seen) / n
        seen, lower = seen + n, upper
    return bounds[-1] if bounds else None  # beyond the last bound: at least that late


def series(conn: psycopg.Connection[Any], window_min: int = 60) -> list[Minute]:
    """The last `window_min` minutes, oldest first, all replicas added up (minutes no replica
    wrote are left out). The current minute's rate is over the part of it that has passed."""
    by_minute: dict[datetime, list[tuple[Any, ...]]] = {}
    for row in conn.execute(QUERIES["console_stats"], {"window": window_min}):
        by_minute.setdefault(row[0], []).append(row)
    out = []
    for at, rows in sorted(by_minute.items()):
        bounds = list(rows[-1][5])
        merged = [0] * len(bounds)
        for r in rows:
            if list(r[5]) == bounds:
                merged = [a + b for a, b in zip(merged, r[6], strict=True)]
        # A minute's first write carries what was fired since the previous one, up to
        # STATS_EVERY_S before the minute began: the current minute's counts cover that much more.
        elapsed = (max(r[7] for r in rows) - at).total_seconds() + STATS_EVERY_S
        covered = 60.0 if (rows[0][8] - at).total_seconds() >= 60 else min(60.0, max(1.0, elapsed))
        out.append(
            Minute(
                at=at,
                fires_per_s=sum(r[2] for r in rows) / covered,
                rejected=sum(r[3] for r in rows),
                overdue=max(r[4] for r in rows),
                p50_s=quantile(bounds, merged, 0.5),
                p99_s=quantile(bounds, merged, 0.99),
                replicas=len(rows),
                bounds=tuple(bounds),
                counts=tuple(merged),
            )
        )
    return out


def lateness(minutes: list[Minute], now: datetime, window_min: int = 5) -> dict[str, Any]:
    """The lateness of the last `window_min` minutes (the current one included), what the chart
    draws a minute at a time: PubAck time minus dueAt, what a consumer sees (metric
    timer_lateness_seconds). Not the row's `reached_at`: a claim records when it took the
    occurrence, up to LOOKAHEAD_MS (100 ms) before dueAt, so that read 0 whenever the fleet kept
    up."""
    since = now.replace(second=0, microsecond=0) - timedelta(minutes=window_min - 1)
    recent = [m for m in minutes if m.at >= since]
    bounds = list(recent[-1].bounds) if recent else []
    merged = [0] * len(bounds)
    for m in recent:
        if list(m.bounds) == bounds:
            merged = [a + b for a, b in zip(merged, m.counts, strict=True)]
    return {
        "window_s": window_min * 60.0,
        "fired": sum(merged),
        "p50_s": quantile(bounds, merged, 0.5),
        "p99_s": quantile(bounds, merged, 0.99),
    }


def running(conn: psycopg.Connection[Any]) -> list[str]:
    """The replicas alive by their stats (written within ALIVE_S): what `status` counts as running."""
    return [r["worker_id"] for r in replicas_seen(conn) if r["alive"]]


def replicas_seen(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Replicas that wrote stats in the last 10 minutes: worker id, last seen, alive or not."""
    return [
        {"worker_id": w, "last_seen": seen, "ago_s": float(ago), "alive": float(ago) <= ALIVE_S}
        for w, seen, ago in conn.execute(QUERIES["console_replicas"])
    ]
