"""`burst` and `burst-window`: 100,000 timers due at one instant, without and with a firing window;
what a consumer sees: its busiest second, and each event's lateness against its planned instant."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta

import psycopg

from tools.bench.rig import Context, Metrics, until_fired
from worker.adapters.postgres import db
from worker.contract import MessageIds, duration
from worker.core.window import planned_at
from worker.devkit.harness import percentile
from worker.devkit.recorder import Firing

# Rows as upsert_schedules leaves a window's: the planned instant in due_at, dueAt in the others.
SEED_BURST_SQL = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, nominal_due_at, fire_window)
SELECT b.tenant_id, b.service_call_id, 'Scheduled', b.planned, %(due)s, %(nominal)s, %(window)s
FROM unnest(%(tenant_id)s::text[], %(service_call_id)s::text[], %(planned)s::timestamptz[])
     AS b(tenant_id, service_call_id, planned)
"""
TENANTS = 10


async def burst(ctx: Context) -> Metrics:
    """Every timer due at one instant, no window: the spike."""
    return await _burst(ctx, None)


async def burst_window(ctx: Context) -> Metrics:
    """The same burst with `window: PT10M` (scaled with --scale, at least 10 s): a steady rate."""
    return await _burst(ctx, ctx.seconds(600, floor=10))


async def _burst(ctx: Context, window_s: float | None) -> Metrics:
    n = ctx.n(100_000)
    async with ctx.rig() as rig:
        names = rig.start_replicas(ctx.replicas)
        await rig.wait_replicas_up(names)
        recorder = rig.recorder(durable="bench-receiver")  # received as a user's consumer would
        await recorder.start()
        due = await rig.scalar("SELECT now()") + timedelta(seconds=5 + n / 50_000)
        window = None if window_s is None else duration(timedelta(seconds=window_s))
        ctx.progress(f"{n:,} timers due at one instant, window {window or 'none'}")
        await _seed(rig.db_url, n, due, window)
        try:
            await until_fired(rig, n, timeout=(window_s or 0) + 120 + n / 1000, progress=ctx.progress, rss=[])
            await recorder.wait_for(n, timeout=30)
        finally:
            await recorder.stop()
        return {"timers": n, "window_s": window_s or 0.0, **burst_measures(recorder.firings, n)}


async def _seed(db_url: str, n: int, due: datetime, window: str | None) -> None:
    ids = MessageIds(db.fleet_secret(db_url))
    tenants = [f"t{i % TENANTS}" for i in range(n)]
    keys = [f"b-{i}" for i in range(n)]
    planned = [
        due if window is None else planned_at(ids, t, k, due, window)
        for t, k in zip(tenants, keys, strict=True)
    ]
    params = {
        "tenant_id": tenants,
        "service_call_id": keys,
        "planned": planned,
        "due": due,
        "nominal": None if window is None else due,
        "window": window,
    }
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(SEED_BURST_SQL, params)
        await conn.execute("VACUUM ANALYZE timers")


def burst_measures(events: list[Firing], n: int) -> Metrics:
    """The first receipts' lateness against plannedAt (or dueAt), events a second, any early."""
    first: dict[str, Firing] = {}
    for e in events:
        first.setdefault(e.service_call_id, e)
    late = [(e.received_at - (e.planned_at or e.due_at)) * 1000 for e in first.values()]
    per_second = Counter(int(e.received_at) for e in first.values())
    span = max(per_second) - min(per_second) + 1 if per_second else 1
    return {
        "lateness_p50_ms": percentile(late, 50),
        "lateness_p99_ms": percentile(late, 99),
        "lateness_max_ms": max(late, default=float("nan")),
        "peak_per_s": float(max(per_second.values(), default=0)),
        "mean_per_s": len(first) / span,
        "receive_span_s": float(span),
        # reachedAt is the replica's database-clock time at publish: never before plannedAt.
        "early": float(sum(1 for e in first.values() if e.reached_at < (e.planned_at or e.due_at))),
        "lost": float(n - len(first)),
    }
