"""`intake-quota` (a backlog beside 5M timers, the tenant quota on and off) and `intake-tenants`
(a backlog over 5,000 tenants and over 10): one replica per phase, timed by registered_at, in
rounds whose order alternates; the best of each, and the ratio."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from tools.bench.realistic import build_realistic
from tools.bench.rig import Context, Metrics, Rig, schedule_command

FOLD_SQL = """
WITH gone AS (DELETE FROM tenant_pending RETURNING tenant_id, pending)
INSERT INTO tenant_pending (tenant_id, pending) SELECT tenant_id, sum(pending) FROM gone GROUP BY 1
"""
QUOTA = 10_000  # above every tenant's pending timers here: the check runs, and never rejects


async def _phase(rig: Rig, ctx: Context, tag: str, n: int, tenants: int, env: dict[str, str]) -> float:
    """`n` new ScheduleTimers over `tenants` tenants stored by one replica: its commands a second."""
    due = datetime.now(UTC) + timedelta(days=2)
    bodies = [
        schedule_command(rig.names["subject_prefix"], f"tenant-{i % tenants}", f"{tag}-{i}", due)
        for i in range(n)
    ]
    await rig.publish_commands(bodies)
    # one tenant_pending row a tenant, as retention leaves it: else a quota phase folds the last's
    await rig.db_.execute(FOLD_SQL)
    await rig.db_.execute("VACUUM tenant_pending")
    rig.fleet.start(1, env)
    deadline = time.monotonic() + 120 + n / 200
    like = f"{tag}-%"
    while (
        stored := int(await rig.scalar("SELECT count(*) FROM timers WHERE service_call_id LIKE %s", like))
    ) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{tag}: {stored:,} of {n:,} commands stored before the deadline")
        ctx.progress(f"{tag}: {stored:,}/{n:,} stored")
        await asyncio.sleep(0.5)
    await asyncio.to_thread(rig.fleet.terminate_all)
    span = float(
        await rig.scalar(
            "SELECT extract(epoch FROM max(registered_at) - min(registered_at)) FROM timers"
            " WHERE service_call_id LIKE %s",
            like,
        )
    )
    return n / span


async def intake_quota(ctx: Context) -> Metrics:
    rows, tenants, n = ctx.n(5_000_000, floor=10_000), 1_000, ctx.n(50_000, floor=2_000)
    async with ctx.rig() as rig:
        ctx.progress(f"building a table of {rows:,} timers over {tenants:,} tenants")
        await asyncio.to_thread(build_realistic, rig.db_url, rows, tenants)  # tenant-0 .. tenant-999
        rates: dict[str, list[float]] = {"off": [], "on": []}
        # alternating: each phase leaves the table larger for the next
        for round_, order in enumerate((("off", "on"), ("on", "off"))):
            for quota in order:
                limit = str(QUOTA if quota == "on" else 0)
                rates[quota].append(
                    await _phase(
                        rig, ctx, f"q{quota}{round_}", n, tenants, {"TIMER_TENANT_MAX_PENDING": limit}
                    )
                )
        off, on = max(rates["off"]), max(rates["on"])
        return {
            "table_rows": rows,
            "commands": n,
            "commands_per_s_quota_off": off,
            "commands_per_s_quota_on": on,
            "quota_on_over_off": on / off,
        }


async def intake_tenants(ctx: Context) -> Metrics:
    n = ctx.n(50_000, floor=5_000)
    async with ctx.rig() as rig:
        rates: dict[int, list[float]] = {10: [], 5_000: []}
        for round_, order in enumerate(((10, 5_000), (5_000, 10))):  # alternating, as intake_quota
            for tenants in order:
                rates[tenants].append(await _phase(rig, ctx, f"n{tenants}r{round_}", n, tenants, {}))
        few, many = max(rates[10]), max(rates[5_000])
        return {
            "commands": n,
            "commands_per_s_10_tenants": few,
            "commands_per_s_5000_tenants": many,
            "many_over_few": many / few,
        }
