"""The scenarios, each a run in a fresh Rig returning its measures; lateness is a JetStream
consumer's receive time minus dueAt (this machine's clock, the database's machine)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from tools.bench.burst import burst, burst_window
from tools.bench.intake_scale import intake_quota, intake_tenants
from tools.bench.producer import producer
from tools.bench.rig import (
    BACKEND_PID_SQL,
    Context,
    Metrics,
    Rig,
    lateness_ms,
    postgres_cpu_s,
    schedule_command,
    until_fired,
    until_marked,
)
from tools.bench.shapes import drain_shapes
from tools.bench.soak import soak
from tools.bench.steady import steady


async def drain(ctx: Context) -> Metrics:
    """N overdue timers (as after downtime): claimed, published and recorded as fast as it goes."""
    n = ctx.n(1_000_000)
    async with ctx.rig() as rig:
        ctx.progress(f"seeding {n:,} overdue timers")
        await rig.seed(n, start_s=-3660, rate=n / 3600, key_prefix="d-")
        rss: list[float] = []
        started, started_at = time.monotonic(), time.time()
        rig.start_replicas(ctx.replicas)
        await until_fired(rig, n, timeout=60 + n / 1000, progress=ctx.progress, rss=rss)
        left = await until_marked(rig, "d-")
        wall = time.monotonic() - started
        cpu = rig.cpu_s()
        state = await rig.events_state()
        return {
            "timers": n,
            "fires_per_s": n / state.span_s,
            # from starting the replicas to the last event stored, not to when this loop noticed
            "catchup_fires_per_s": n / (state.last_ts - started_at),
            "startup_s": state.first_ts - started_at,
            "wall_s": wall,
            "stored_duplicates": state.messages - n,
            "left_scheduled": left,
            "replica_cpu_ms_per_1k": cpu / n * 1e6,
            "rss_max_mb": max(rss, default=0.0),
        }


async def _lateness(ctx: Context, rate: int) -> Metrics:
    """`rate` timers come due per second for 60 s, 1,000,000 future timers pending."""
    pending, duration = ctx.n(1_000_000), ctx.seconds(60, floor=20)
    n = int(rate * duration)
    async with ctx.rig() as rig:
        ctx.progress(f"seeding {pending:,} future timers")
        await rig.seed(pending, start_s=86_400, rate=pending / 86_400, key_prefix="f-")
        names = rig.start_replicas(ctx.replicas)
        await rig.wait_replicas_up(names)
        recorder = rig.recorder(durable="bench-receiver")  # received as a user's consumer would
        await recorder.start()
        ctx.progress(f"{n:,} timers coming due at {rate:,}/s for {duration:.0f}s")
        await rig.seed(n, start_s=5 + n / 50_000, rate=rate, key_prefix="l-")
        rss: list[float] = []
        try:
            await until_fired(rig, n, timeout=duration + 120, progress=ctx.progress, rss=rss)
            await recorder.wait_for(n, timeout=30)
        finally:
            await recorder.stop()
        fired = len({e.service_call_id for e in recorder.firings})
        return {
            "due_per_s": rate,
            "timers": n,
            **lateness_ms(recorder.firings, "l-"),
            "lost": n - fired,
            "rss_max_mb": max(rss, default=0.0),
        }


async def lateness_1k(ctx: Context) -> Metrics:
    return await _lateness(ctx, 1000)


async def lateness_5k(ctx: Context) -> Metrics:
    return await _lateness(ctx, 5000)


async def intake(ctx: Context) -> Metrics:
    """Commands already waiting in the stream (one in ten a duplicate): committed and acknowledged."""
    unique = ctx.n(200_000)
    async with ctx.rig() as rig:
        prefix = rig.names["subject_prefix"]
        due = datetime.now(UTC) + timedelta(days=1)
        bodies = [schedule_command(prefix, f"t{i % 10}", f"i-{i}", due) for i in range(unique)]
        bodies += bodies[::10]  # redelivered or re-sent commands: no-ops
        ctx.progress(f"publishing {len(bodies):,} commands")
        total = await rig.publish_commands(bodies)
        rig.start_replicas(ctx.replicas)
        jsm = rig.nc_.jetstream()
        deadline = time.monotonic() + 60 + total / 1000
        while time.monotonic() < deadline:
            info = await jsm.consumer_info(rig.names["command_stream"], rig.names["consumer"])
            waiting = (info.num_pending or 0) + (info.num_ack_pending or 0)
            if waiting == 0:
                break
            ctx.progress(f"{total - waiting:,}/{total:,} commands done")
            await asyncio.sleep(0.5)
        stored = int(await rig.scalar("SELECT count(*) FROM timers"))
        span = float(
            await rig.scalar("SELECT extract(epoch FROM max(registered_at) - min(registered_at)) FROM timers")
        )
        return {
            "commands": total,
            "commands_per_s": total / span,
            "stored": stored,
            "missing": unique - stored,
        }


async def failover(ctx: Context) -> Metrics:
    """SIGKILL a replica while it holds leases; how long until its claimed timers fire elsewhere."""
    rate, duration = 2000, 30.0
    n = int(rate * duration)
    async with ctx.rig() as rig:
        names = rig.start_replicas(ctx.replicas)
        await rig.wait_replicas_up(names)
        recorder = rig.recorder()
        await recorder.start()
        await rig.seed(n, start_s=3, rate=rate, key_prefix="o-")
        await asyncio.sleep(8)  # let the fleet settle into the steady load before the kill
        victim, orphans, killed_at = await _kill_a_lease_holder(rig)
        ctx.progress(f"killed {victim} holding {len(orphans)} leases")
        await recorder.wait_for(n, timeout=duration + 60)
        fired = {e.service_call_id for e in recorder.firings}
        # every orphan counts, also those fired just before the kill: how late were its timers
        of_victim = [e for e in recorder.firings if e.service_call_id in orphans]
        return {
            "orphaned": len(orphans),
            "refired_after_kill": len({e.service_call_id for e in of_victim if e.received_at >= killed_at}),
            **{k.replace("lateness", "orphan_lateness"): v for k, v in lateness_ms(of_victim, "o-").items()},
            "lost": n - len(fired),
        }


async def _kill_a_lease_holder(rig: Rig, tries: int = 50) -> tuple[str, set[str], float]:
    """SIGKILL a replica holding claims: a batch in flight (rows whose xmax is its open
    transaction) or a committed lease. Frozen while they are read, so they are what it died with."""
    for _ in range(tries):
        owner = await rig.scalar(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
            " AND state LIKE 'idle in transaction%%' AND backend_xid IS NOT NULL LIMIT 1"
        )
        if owner is None or owner not in rig.fleet.alive():
            await asyncio.sleep(0.005)
            continue
        rig.fleet.signal(owner, signal.SIGSTOP)
        cur = await rig.db_.execute(
            "SELECT service_call_id FROM timers WHERE state = 'Scheduled'"
            " AND (lease_owner = %s AND lease_expires_at > now()"
            "      OR xmax::text IN (SELECT backend_xid::text FROM pg_stat_activity"
            "                        WHERE application_name = %s AND backend_xid IS NOT NULL))",
            (owner, owner),
        )
        orphans = {r[0] for r in await cur.fetchall()}
        rig.fleet.signal(owner, signal.SIGKILL)
        killed_at = time.time()
        if orphans:
            return owner, orphans, killed_at
        rig.start_replicas(1)  # it recorded everything before it died: try again with a fresh one
    raise RuntimeError("never caught a replica holding leases")


async def _catchup(ctx: Context, backlog: int, one_tenant: bool) -> Metrics:
    """A large overdue backlog drains oldest first while new timers keep coming due on time."""
    fresh_rate = 200
    async with ctx.rig() as rig:
        ctx.progress(f"seeding {backlog:,} overdue timers")
        tenants = 1 if one_tenant else 10
        await rig.seed(
            backlog, start_s=-3660, rate=backlog / 3600, key_prefix="c-", tenant="noisy", tenants=tenants
        )
        fresh_for = 10 + backlog / 10_000  # covers the drain with room to spare
        fresh = int(fresh_rate * fresh_for)
        await rig.seed(fresh, start_s=8, rate=fresh_rate, key_prefix="n-", tenant="quiet", tenants=1)
        recorder = rig.recorder("quiet0")
        await recorder.start()
        rss: list[float] = []
        rig.start_replicas(ctx.replicas)
        await until_fired(rig, backlog + fresh, timeout=120 + backlog / 1000, progress=ctx.progress, rss=rss)
        await recorder.wait_for(fresh, timeout=30)
        await until_marked(rig, "c-")
        order = await rig.scalar(
            "SELECT corr(extract(epoch FROM due_at), extract(epoch FROM reached_at)) "
            "FROM timers WHERE service_call_id LIKE 'c-%%'"
        )
        span = await rig.scalar(
            "SELECT extract(epoch FROM max(reached_at) - min(reached_at)) "
            "FROM timers WHERE service_call_id LIKE 'c-%%'"
        )
        return {
            "backlog": backlog,
            "fresh": fresh,
            **{
                k.replace("lateness", "fresh_lateness"): v
                for k, v in lateness_ms(recorder.firings, "n-").items()
            },
            "backlog_order_corr": float(order or 0.0),
            "backlog_fires_per_s": backlog / float(span),
        }


async def catchup(ctx: Context) -> Metrics:
    return await _catchup(ctx, ctx.n(1_000_000), one_tenant=False)


async def fairness(ctx: Context) -> Metrics:
    return await _catchup(ctx, ctx.n(500_000), one_tenant=True)


async def idle(ctx: Context) -> Metrics:
    """Nothing due: how many statements each replica sends to Postgres per second."""
    window = ctx.seconds(60, floor=30)
    async with ctx.rig() as rig:
        await rig.seed(ctx.n(100_000), start_s=86_400, rate=10, key_prefix="f-")
        names = rig.start_replicas(ctx.replicas)
        await rig.wait_replicas_up(names)
        # past start-up and the 10 s an idle backend may hold its statistics: the steady state
        await asyncio.sleep(15)
        before = await rig.transactions()
        ctx.progress(f"counting statements for {window:.0f}s")
        await asyncio.sleep(window)
        after = await rig.transactions()
        rss = rig.rss_mb()
        return {
            "statements_per_s_per_replica": (after - before) / window / ctx.replicas,
            "rss_max_mb": max(rss.values(), default=0.0),
        }


# pg_stat_io's counters and the table's sizes: what `capacity` reads around each phase.
IO_SQL = """
SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,
       coalesce(sum(writes) FILTER (WHERE object = 'wal'), 0)::bigint,
       coalesce(sum(fsyncs) FILTER (WHERE object = 'wal'), 0)::bigint,
       coalesce(sum(writes) FILTER (WHERE object <> 'wal'), 0)::bigint,
       coalesce(sum(fsyncs) FILTER (WHERE object <> 'wal'), 0)::bigint
FROM pg_stat_io
"""
SIZES_SQL = """
SELECT CASE WHEN c.relname LIKE 'pg_toast%%' THEN 'toast' ELSE c.relname END, pg_relation_size(c.oid)
FROM pg_class c WHERE c.relname IN ('timers', 'timers_pkey', 'timers_due', 'timers_finished')
   OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE relname = 'timers')
"""


async def capacity(ctx: Context) -> Metrics:
    """What Postgres spends per stored, fired and vacuumed timer (docs/OPERATIONS.md's model)."""
    n = ctx.n(100_000)
    async with ctx.rig() as rig:
        pid = int(await rig.scalar(BACKEND_PID_SQL))

        async def counters() -> list[float]:  # after a CHECKPOINT and the backends' stats flush
            await rig.db_.execute("CHECKPOINT")
            await asyncio.sleep(1.5)
            await rig.db_.execute("SELECT pg_stat_clear_snapshot()")
            return [*map(float, (await (await rig.db_.execute(IO_SQL)).fetchall())[0]), postgres_cpu_s(pid)]

        async def phase(name: str, work: Coroutine[Any, Any, Any]) -> Metrics:
            before, started = await counters(), time.monotonic()
            await work
            took, after = time.monotonic() - started, await counters()
            names = ("wal_bytes", "wal_writes", "wal_fsyncs", "data_writes", "data_fsyncs", "cpu_ms")
            per = {f"{name}_{k}": (a - b) / n for k, a, b in zip(names, after, before, strict=True)}
            return per | {f"{name}_cpu_ms": per[f"{name}_cpu_ms"] * 1000, f"{name}_per_s": n / took}

        due = datetime.now(UTC) + timedelta(days=1)
        prefix = rig.names["subject_prefix"]
        await rig.publish_commands(schedule_command(prefix, f"t{i % 10}", f"i-{i}", due) for i in range(n))
        rig.start_replicas(ctx.replicas)
        m = await phase("intake", _until(rig, "SELECT count(*) >= %s FROM timers", n))
        await rig.db_.execute("VACUUM ANALYZE timers")
        m |= {f"{name}_bytes": size / n for name, size in await (await rig.db_.execute(SIZES_SQL)).fetchall()}
        await rig.seed(n, start_s=-3660, rate=n / 3600, key_prefix="d-")
        m |= await phase("fire", _until(rig, "SELECT NOT EXISTS (" + DUE_LEFT_SQL + ")"))
        # the VACUUM after the drain: what autovacuum left, the rest is in the phases
        return {"timers": n} | m | await phase("vacuum", rig.db_.execute("VACUUM timers"))


DUE_LEFT_SQL = "SELECT FROM timers WHERE state = 'Scheduled' AND due_at < now()"


async def _until(rig: Rig, sql: str, *params: Any, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not await rig.scalar(sql, *params):
        if time.monotonic() > deadline:
            raise RuntimeError(f"not done in {timeout:.0f}s: {sql}")
        await asyncio.sleep(0.2)


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Context], Coroutine[Any, Any, Metrics]]
    targets: tuple[tuple[str, str, float], ...]  # (metric, "<=" or ">=", target)
    on_request: bool = False  # only when named: too long for every `make bench`


SCENARIOS = {
    s.name: s
    for s in (
        Scenario("drain", drain, (("fires_per_s", ">=", 15_000), ("rss_max_mb", "<=", 150))),
        Scenario("drain-shapes", drain_shapes, (("burst_over_fresh", ">=", 0.9),), on_request=True),
        Scenario(
            "lateness-1k",
            lateness_1k,
            (("lateness_p50_ms", "<=", 10), ("lateness_p99_ms", "<=", 50), ("lateness_max_ms", "<=", 500)),
        ),
        Scenario("lateness-5k", lateness_5k, (("lateness_p99_ms", "<=", 250),)),
        Scenario("intake", intake, (("commands_per_s", ">=", 20_000),)),
        Scenario("intake-quota", intake_quota, (("quota_on_over_off", ">=", 0.9),)),
        Scenario("intake-tenants", intake_tenants, (("many_over_few", ">=", 0.8),)),
        Scenario("producer", producer, (("commands_per_s", ">=", 40_000),)),
        Scenario("failover", failover, (("orphan_lateness_p99_ms", "<=", 5000),)),
        Scenario("catchup", catchup, (("fresh_lateness_p99_ms", "<=", 1000),)),
        Scenario("fairness", fairness, (("fresh_lateness_p99_ms", "<=", 1000),)),
        Scenario("idle", idle, (("statements_per_s_per_replica", "<=", 1),)),
        Scenario("steady", steady, (("pg_cpu_over_empty", "<=", 1.5),)),
        Scenario(
            "soak",
            soak,
            (("max_window_p99_ms", "<=", 50), ("lost", "<=", 0), ("cancelled_fired", "<=", 0)),
            on_request=True,
        ),
        Scenario("capacity", capacity, ()),
        Scenario("burst", burst, (("early", "<=", 0), ("lost", "<=", 0)), on_request=True),
        Scenario("burst-window", burst_window, (("early", "<=", 0), ("lost", "<=", 0)), on_request=True),
    )
}
