"""`steady`: timers coming due at a steady rate beside a table as months of scheduling leave it
(issue 36), and the same load on an empty table, in turns: Postgres' CPU per fire on each, and
their ratio. On the big table the claim's plan once flipped to a bitmap scan that re-read every
occurrence fired since the last vacuum, Postgres' CPU per fire 8 x the empty table's.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from tools.bench.context import Context, Metrics, lateness_ms, until_fired
from tools.bench.realistic import FULL_ROWS, FULL_TENANTS, build_realistic
from tools.bench.rig import Rig

RATE = 500  # due per second: about 30 a claim, the few-rows-due case that flipped the plan
BACKEND_PID_SQL = "SELECT pg_backend_pid()"  # bench-only: finds the server's processes


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def postgres_cpu_s(backend_pid: int) -> float:
    """CPU seconds (user + system) the whole Postgres server used so far: its postmaster, every
    process it runs (backends, autovacuum, the WAL writer...) and those that ended (the
    postmaster reaped them). NaN when the server is not on this machine."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        postmaster = int(_stat(backend_pid)[1])  # the backend's parent
        f = _stat(postmaster)
    except (OSError, ValueError, IndexError):
        return float("nan")
    total = sum(int(x) for x in f[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            f = _stat(int(entry.name))
        except OSError:
            continue  # ended meanwhile: counted in the postmaster's cutime
        if int(f[1]) == postmaster:
            total += int(f[11]) + int(f[12])
    return total / tick


async def _arm(ctx: Context, rows: int, duration: float) -> Metrics:
    """RATE timers come due per second for `duration` beside `rows` pending ones (a realistic
    table, or none); Postgres' CPU from the first one due to the last one fired."""
    n = int(RATE * duration)
    async with Rig(ctx.admin_url, ctx.nats_url, ctx.workdir) as rig:
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
        # The load's start: the seeding before it, and the idle claims, are not its cost.
        await asyncio.sleep(max(0.0, lead - (time.monotonic() - seeded)))
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
    """The empty table's arm, then the realistic table's: one run of each, back to back."""
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
