"""`soak`: a long steady run on a realistic table, in windows of 30 s (docs/BENCHMARKS.md).

Producers schedule 500 timers a second (`--soak-rate`), each due 10 to 130 s later, and cancel a
tenth as many, for 15 minutes beside 5,000,000 pending timers, retention deleting as fast as
timers finish; a consumer in a process of its own (receiver.py) takes the receive times. Once a
second a sampler reads what could slow a window (soak_report.py sets it beside the lateness).
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import random
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from tools.bench.realistic import FULL_ROWS, FULL_TENANTS, build_realistic
from tools.bench.receiver import Receiver
from tools.bench.rig import BACKEND_PID_SQL, Context, Metrics, Progress, Rig, postgres_cpu_s, python_child
from tools.bench.soak_report import SAMPLED, Sample, machine_waits_s, summary
from worker.client import TimerClient

RATE = 500  # ScheduleTimer commands a second (--soak-rate)
CANCELLED = 0.1  # CancelTimer commands per ScheduleTimer, each of a timer scheduled in this run
TICK_S = 0.1  # the producers send what is due every tick
KEY_PREFIX = "s-"

# Bench-only SQL: what Postgres was doing, once a second (SAMPLED names its columns).
SAMPLE_SQL = r"""
SELECT extract(epoch FROM clock_timestamp())::float8,
       pg_table_size('timers'), pg_indexes_size('timers'),
       s.n_live_tup, s.n_dead_tup, s.n_tup_del, s.autovacuum_count, s.autoanalyze_count,
       (pg_current_wal_lsn() - '0/0')::bigint, pg_walfile_name(pg_current_wal_lsn()),
       (SELECT v.phase FROM pg_stat_progress_vacuum v WHERE v.relid = 'timers'::regclass LIMIT 1),
       (SELECT a.wait_event FROM pg_stat_activity a WHERE a.backend_type = 'checkpointer'),
       (SELECT count(*) FROM pg_stat_activity a
        WHERE a.datname = current_database() AND a.state = 'active' AND a.pid <> pg_backend_pid()
          AND position('DELETE FROM timers t' IN a.query) > 0),
       (SELECT wal_fpi FROM pg_stat_wal),
       (SELECT p.phase FROM pg_stat_progress_analyze p WHERE p.relid = 'timers'::regclass LIMIT 1),
       (SELECT round(extract(epoch FROM clock_timestamp() - a.query_start) * 1000)::int || ' ms '
               || left(regexp_replace(a.query, '^(\s*--[^\n]*\n)*\s*', ''), 40)
        FROM pg_stat_activity a
        WHERE a.datname = current_database() AND a.state = 'active' AND a.pid <> pg_backend_pid()
        ORDER BY a.query_start LIMIT 1)
FROM pg_stat_user_tables s WHERE s.relid = 'timers'::regclass
"""
CHECKPOINTS_SQL = "SELECT num_timed + num_requested FROM pg_stat_checkpointer"  # PostgreSQL 17+
CHECKPOINTS_SQL_16 = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
SET_VACUUM_COST_DELAY_SQL = "ALTER TABLE timers SET (autovacuum_vacuum_cost_delay = {})"
VACUUM_COST_DELAY_SQL = """
SELECT o.option_value::float8 FROM pg_class c, pg_options_to_table(c.reloptions) o
WHERE c.oid = 'timers'::regclass AND o.option_name = 'autovacuum_vacuum_cost_delay'
"""


@dataclass
class Load:
    """What the producers sent and JetStream accepted, kept as it changes (a set difference of the
    whole run at its end would stall the producers and the sampler)."""

    rate: int = RATE
    due: dict[str, float] = field(default_factory=dict)
    cancelled: set[str] = field(default_factory=set)
    expected: set[str] = field(default_factory=set)
    unsure: set[str] = field(default_factory=set)  # a send failed: it may or may not be stored
    tenant: dict[str, str] = field(default_factory=dict)
    last_due: float = 0.0

    async def run(
        self, client: TimerClient, seconds: float, lead: tuple[float, float], margin: float
    ) -> None:
        """`rate` schedules and a tenth as many cancels a second, sent every TICK_S (a slow send
        is caught up at the next tick)."""
        started = time.monotonic()
        recent: deque[str] = deque(maxlen=self.rate * 2)  # the last two seconds' keys
        scheduled = cancels = 0
        while (elapsed := time.monotonic() - started) < seconds:
            now = time.time()
            batch: list[dict[str, Any]] = []
            for i in range(scheduled, int(self.rate * elapsed)):
                key = KEY_PREFIX + hashlib.md5(str(i).encode()).hexdigest()  # 34 characters, unordered
                due = datetime.fromtimestamp(now + random.uniform(*lead), UTC)
                batch.append({"tenantId": f"tenant-{i % FULL_TENANTS}", "serviceCallId": key, "dueAt": due})
            scheduled += len(batch)
            await self._schedule(client, batch)
            recent.extend(b["serviceCallId"] for b in batch)
            wanted = int(CANCELLED * self.rate * elapsed) - cancels
            # only timers `margin` or more from due: one fired anyway was fired after its cancel
            victims = [k for k in recent if self.due.get(k, 0.0) - now >= margin and k not in self.cancelled]
            victims = random.sample(victims, min(wanted, len(victims)))
            cancels += len(victims)
            await self._cancel(client, victims)
            await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - started - elapsed)))

    async def _schedule(self, client: TimerClient, batch: list[dict[str, Any]]) -> None:
        for b, s in zip(batch, await client.schedule_many(batch) if batch else [], strict=True):
            key = b["serviceCallId"]
            self.tenant[key] = b["tenantId"]
            if s.outcome == "accepted":
                self.due[key] = b["dueAt"].timestamp()
                self.expected.add(key)
                self.last_due = max(self.last_due, self.due[key])
            else:
                self.unsure.add(key)

    async def _cancel(self, client: TimerClient, keys: list[str]) -> None:
        if keys:
            sent = await client.cancel_many([{"tenantId": self.tenant[k], "serviceCallId": k} for k in keys])
            for k, s in zip(keys, sent, strict=True):
                (self.cancelled if s.outcome == "accepted" else self.unsure).add(k)
                self.expected.discard(k)


class Receipts:
    """The first receipt (due, received) of each key, taken from the consumer's file each second."""

    def __init__(self, receiver: Receiver, load: Load) -> None:
        self.receiver, self.load = receiver, load
        self.first: dict[str, tuple[float, float]] = {}
        self.of_expected = 0  # first receipts of keys that were expected when they came

    def absorb(self) -> None:
        for key, due, received in self.receiver.take():
            if key.startswith(KEY_PREFIX) and key not in self.first:
                self.first[key] = (due, received)
                self.of_expected += key in self.load.expected
        gc.freeze()  # kept to the end: out of the collector's walks, which would grow with the run


class Sampler:
    """Once a second until stopped: a Sample of Postgres (one query), the replicas, the machine."""

    def __init__(self, rig: Rig, backend_pid: int, checkpoints_sql: str, receipts: Receipts) -> None:
        self.rig, self.receipts, self.backend_pid = rig, receipts, backend_pid
        self.checkpoints_sql = checkpoints_sql
        self.samples: list[Sample] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            row = await (await self.rig.db_.execute(SAMPLE_SQL)).fetchone()
            assert row is not None
            checkpoints = int(await self.rig.scalar(self.checkpoints_sql))
            iowait_s, steal_s = machine_waits_s()
            self.samples.append(
                Sample(
                    **dict(zip(SAMPLED, row, strict=True)),
                    checkpoints=checkpoints,
                    rss_mb=max(self.rig.rss_mb().values(), default=0.0),
                    pg_cpu_s=postgres_cpu_s(self.backend_pid),
                    replicas_cpu_s=self.rig.cpu_s(),
                    load_1m=os.getloadavg()[0],
                    iowait_s=iowait_s,
                    steal_s=steal_s,
                )
            )
            self.receipts.absorb()
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - started)))


class CpuProbe:
    """report.probe in its own process: (epoch, loop ms) once a second."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, float]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await python_child("from tools.bench.report import probe; probe()")
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            at, ms = line.split()
            self.runs.append((float(at), float(ms)))

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        if self._reading is not None:
            await self._reading


async def soak(ctx: Context) -> Metrics:
    rows, duration, width = ctx.n(FULL_ROWS), ctx.seconds(900, floor=20), ctx.seconds(30, floor=5)
    lead = (ctx.seconds(10, floor=2), ctx.seconds(130, floor=6))
    margin = ctx.seconds(30, floor=3)
    # not scaled: retention may not be shorter than the command stream's 2-minute duplicate window
    settings = {"retention": "2m", "command_max_age": "2m", "stuck_after": "1m"}
    async with ctx.rig(**settings) as rig:
        ctx.progress(f"building a table of {rows:,} pending timers")
        await asyncio.to_thread(build_realistic, rig.db_url, rows, FULL_TENANTS)
        vacuum_cost_delay = await _vacuum_cost_delay(rig, ctx.vacuum_cost_delay_ms, ctx.progress)
        await rig.wait_replicas_up(rig.start_replicas(ctx.replicas))
        async with Receiver(rig.workdir / "receipts.jsonl") as receiver:
            await receiver.start(
                ctx.nats_url, rig.names["subject_prefix"], rig.names["event_stream"], "bench-receiver"
            )
            pid = int(await rig.scalar(BACKEND_PID_SQL))
            version = int(await rig.scalar("SHOW server_version_num"))
            load = Load(ctx.soak_rate or RATE)
            receipts = Receipts(receiver, load)
            sampler = Sampler(
                rig, pid, CHECKPOINTS_SQL if version >= 170000 else CHECKPOINTS_SQL_16, receipts
            )
            probe = CpuProbe()
            await probe.start()
            stop = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop))
            client = await TimerClient.connect(ctx.nats_url, rig.names["subject_prefix"])
            start = time.time()
            try:
                async with client:
                    ctx.progress(
                        f"{load.rate}/s scheduled and {CANCELLED * load.rate:.0f}/s cancelled for"
                        f" {duration:.0f}s, due {lead[0]:.0f}-{lead[1]:.0f}s ahead, retention 120s"
                    )
                    producing = asyncio.create_task(load.run(client, duration, lead, margin))
                    await _report_while(producing, sampler, ctx.progress, width)
                    await producing
                await _until_received(receipts, load.last_due + 60, ctx.progress)
            finally:
                stop.set()
                await sampling
                await probe.stop()
                await receiver.stop()
            receipts.absorb()  # what it wrote before it was stopped
    got = receipts.first.keys()
    return {
        "rows": rows,
        "seconds": duration,
        "scheduled": len(load.due),
        "cancelled": len(load.cancelled),
        "fired": len(got & load.expected),
        "lost": len(load.expected - got),
        "cancelled_fired": len(got & load.cancelled),
        "send_errors": len(load.unsure),
        **summary(sampler.samples, probe.runs, receipts.first, start, width, duration, ctx.progress),
        "vacuum_cost_delay_ms": vacuum_cost_delay,
        "rate": load.rate,
    }


async def _vacuum_cost_delay(rig: Rig, ms: float | None, progress: Progress) -> float:
    """Sets `timers`' autovacuum_vacuum_cost_delay to `ms` (None: the migrations' own); what the
    table holds then (nan: none of its own)."""
    if ms is not None:
        await rig.db_.execute(sql.SQL(SET_VACUUM_COST_DELAY_SQL).format(sql.Literal(str(ms))))
    held = await rig.scalar(VACUUM_COST_DELAY_SQL)
    source = "set by --vacuum-cost-delay-ms" if ms is not None else "as the migrations left it"
    progress(
        "autovacuum_vacuum_cost_delay of timers: "
        + ("the server's (none of the table's own)" if held is None else f"{float(held):g} ms ({source})")
    )
    return float("nan") if held is None else float(held)


async def _report_while(task: asyncio.Task[None], sampler: Sampler, progress: Progress, width: float) -> None:
    """A line every window while the load runs, so a long soak shows it is alive."""
    while not task.done():
        await asyncio.wait([task], timeout=width)
        if sampler.samples:
            s = sampler.samples[-1]
            progress(
                f"heap {s.table_bytes / 2**20:.0f} MB, indexes {s.index_bytes / 2**20:.0f} MB,"
                f" dead rows {s.dead:,}, autovacuums {s.autovacuums}, RSS {s.rss_mb:.0f} MB,"
                f" load {s.load_1m:.1f}"
            )


async def _until_received(receipts: Receipts, deadline_at: float, progress: Progress) -> None:
    """Until every expected key was received, or the deadline; RuntimeError if the consumer ended."""
    while (missing := len(receipts.load.expected) - receipts.of_expected) > 0 and time.time() < deadline_at:
        if (status := receipts.receiver.exited) is not None:
            raise RuntimeError(
                f"the soak's consumer exited (status {status}) with {missing:,} timers to fire"
            )
        progress(f"waiting for {missing:,} timers to fire")
        await asyncio.sleep(1)
