"""`steady`: timers coming due at a steady rate beside a realistic table and beside an empty one,
in turns: Postgres' CPU per fire on each, and their ratio (a plan flip once made it 8 x)."""

from __future__ import annotations

import asyncio
import time

from tools.bench.realistic import FULL_ROWS, FULL_TENANTS, build_realistic
from tools.bench.rig import BACKEND_PID_SQL, Context, Metrics, lateness_ms, postgres_cpu_s, until_fired

RATE = 500  # due per second: about 30 a claim, the few-rows-due case that flipped the plan


async def _arm(ctx: Context, rows: int, duration: float) -> Metrics:
    """RATE timers a second for `duration` beside `rows` pending; Postgres' CPU from the first due."""
    n = int(RATE * duration)
    async with ctx.rig() as rig:
        if rows:
            ctx.progress(f"building a table of {rows:,} pending timers")
            await asyncio.to_thread(build_realistic, rig.db_url, rows, FULL_TENANTS)
        names = rig.start_replicas(ctx.replicas)
        await rig.wait_replicas_up(names)
        recorder = rig.recorder(durable="bench-receiver")
        await recorder.start()
        lead, seeded = 5.0, time.monotonic()
        await rig.seed(n, start_s=lead, rate=RATE, key_prefix="l-", tenants=FULL_TENANTS)
        pid = int(await rig.scalar(BACKEND_PID_SQL))
        await asyncio.sleep(max(0.0, lead - (time.monotonic() - seeded)))  # the seeding is not its cost
        ctx.progress(f"{n:,} timers coming due at {RATE}/s for {duration:.0f}s beside {rows:,}")
        cpu = postgres_cpu_s(pid)
        try:
            await until_fired(rig, n, timeout=duration + 120, progress=ctx.progress, rss=[])
            cpu = postgres_cpu_s(pid) - cpu
            await recorder.wait_for(n, timeout=30)
        finally:
            await recorder.stop()
        late = lateness_ms(recorder.firings, "l-")
        return {"pg_cpu_us_per_fire": cpu / n * 1e6, "lateness_p99_ms": late["lateness_p99_ms"]}


async def steady(ctx: Context) -> Metrics:
    rows, duration = ctx.n(FULL_ROWS), ctx.seconds(60, floor=20)
    start = time.monotonic()
    empty = await _arm(ctx, 0, duration)
    big = await _arm(ctx, rows, duration)
    ctx.progress(f"both arms in {time.monotonic() - start:.0f}s")
    return {
        "rows": rows,
        "due_per_s": RATE,
        "empty_pg_cpu_us_per_fire": empty["pg_cpu_us_per_fire"],
        "pg_cpu_us_per_fire": big["pg_cpu_us_per_fire"],
        "pg_cpu_over_empty": big["pg_cpu_us_per_fire"] / empty["pg_cpu_us_per_fire"],
        "empty_lateness_p99_ms": empty["lateness_p99_ms"],
        "lateness_p99_ms": big["lateness_p99_ms"],
    }
