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

# The points a chart draws at most, whatever its range (a week is 10,080 minutes a replica): the
# bins are made wide enough (step_for), so a page reads and draws no more than this many.
MAX_POINTS = 120
# The ranges the console offers, in minutes: as far back as the rows are kept (STATS_KEEP).
RANGES = {"1h": 60, "6h": 6 * 60, "24h": 24 * 60, "7d": 7 * 24 * 60}

# A replica that has not written its stats for this long is not listed as alive (it writes every
# 15 s: three missed writes).
ALIVE_S = 45.0


@dataclass(frozen=True, slots=True)
class Minute:
    """A bin of the fleet's minute stats: one minute, or (a longer range) several added up."""

    at: datetime
    fires_per_s: float
    rejected: float  # a minute
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


def step_for(window_min: int) -> int:
    """The bin, in whole minutes, a window of `window_min` minutes is drawn in: the smallest that
    keeps its bins (the first one reaching back past the window's start, the current one under
    way) within MAX_POINTS."""
    return max(1, -(-window_min // (MAX_POINTS - 1)))


def series(conn: psycopg.Connection[Any], window_min: int = 60) -> list[Minute]:
    """The last `window_min` minutes in bins of step_for(window_min) minutes, oldest first, all
    replicas added up (bins no replica wrote in are left out): fires per second and rejections a
    minute averaged over the bin, overdue its highest, the lateness its histogram's. The current
    bin's rates are over the part of it that has passed."""
    step = step_for(window_min)
    by_bin: dict[datetime, list[tuple[Any, ...]]] = {}
    for row in conn.execute(QUERIES["console_stats"], {"window": window_min, "step": step}):
        by_bin.setdefault(row[0], []).append(row)
    span = step * 60.0
    out = []
    for at, rows in sorted(by_bin.items()):
        # One row per histogram's bounds: the newest bounds' histogram is the bin's (a replica of an
        # older release, with other bounds, counts in the rates but not in the quantiles).
        _, bounds, *_, merged, db_now = rows[-1]
        # A bin's first write carries what was fired since the previous one, up to STATS_EVERY_S
        # before the bin began: the current bin's counts cover that much more.
        elapsed = (max(r[6] for r in rows) - at).total_seconds() + STATS_EVERY_S
        covered = span if (db_now - at).total_seconds() >= span else min(span, max(1.0, elapsed))
        out.append(
            Minute(
                at=at,
                fires_per_s=sum(r[2] for r in rows) / covered,
                # Per minute: a minute's own count, a longer bin's average minute.
                rejected=sum(r[3] for r in rows) * 60.0 / max(covered, 60.0),
                overdue=max(r[4] for r in rows),
                p50_s=quantile(list(bounds), list(merged), 0.5),
                p99_s=quantile(list(bounds), list(merged), 0.99),
                replicas=sum(r[5] for r in rows),
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
