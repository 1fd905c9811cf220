"""`soak` (issue 36): a long steady run on a realistic table, in windows of 30 s.

Producers schedule 500 timers a second (`--soak-rate N`: N), each due 10 to 130 s later, and
cancel a tenth as many a second of those still at least 30 s from due, for 15 minutes, beside the
5,000,000 pending timers of tools/bench/realistic.py, with TIMER_RETENTION=2m so retention deletes
as fast as timers finish.
Lateness is the events' as a user's consumer receives them, in a process of its own as a user's
is (tools/bench/receiver.py); the checks: every timer not cancelled fired, no cancelled one did,
none came early, and the 99th percentile of each window's lateness (target 50 ms). With
`--vacuum-cost-delay-ms N` the table's autovacuum_vacuum_cost_delay is N before the load (the
migrations set 5, 0001 set 1), to compare autovacuums of different pace.

Each window sets beside its lateness what could have slowed it, sampled once a second: the table's
and its indexes' size, dead rows, autovacuums of `timers` (and the seconds one ran), checkpoints
(and the seconds the checkpointer was busy), WAL written and segments switched, rows deleted (the
retention sweeps), the replicas' RSS, Postgres' CPU, and the calibration loop (tools/bench/
calibrate.py's, a tenth of it, in its own process) with the load average, and the time the
machine's CPUs waited on I/O or were taken by the hypervisor (steal, from /proc/stat): a window
slowed by the machine shows as a slow loop or as steal. Then every second whose timers fired later
than the target is set beside what was going on in it, against how often that went on in any
second.

The table goes to stderr with the progress; BENCH_SOAK_SECONDS=<file> also writes every second's
samples and lateness there as JSON, for a closer look.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import itertools
import json
import math
import os
import random
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg import sql

from tools.bench.context import Context, Metrics, Progress, python_child
from tools.bench.realistic import FULL_ROWS, FULL_TENANTS, build_realistic
from tools.bench.receiver import Receiver
from tools.bench.rig import Rig
from tools.bench.steady import BACKEND_PID_SQL, _stat
from worker.client import TimerClient
from worker.devkit.harness import percentile

RATE = 500  # ScheduleTimer commands a second (--soak-rate)
CANCELLED = 0.1  # CancelTimer commands per ScheduleTimer, each of a timer scheduled in this run
TARGET_P99_MS = 50.0  # every window's
TICK_S = 0.1  # the producers send what is due every tick
SAMPLE_S = 1.0
QUIET_LOOP = 1.5  # a second whose calibration loop ran this much over the run's fast ones was not quiet
LONG_STATEMENT_MS = 100  # a statement running this long when sampled is named beside its second
STOLEN_CORES = 0.1  # a second whose CPUs lost this much to the hypervisor (or waited on I/O) says so
KEY_PREFIX = "s-"

# Bench-only SQL (none of it runs in a replica): what Postgres was doing, once a second.
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
# Checkpoints completed: pg_stat_checkpointer from PostgreSQL 17, pg_stat_bgwriter before.
CHECKPOINTS_SQL = "SELECT num_timed + num_requested FROM pg_stat_checkpointer"
CHECKPOINTS_SQL_16 = "SELECT checkpoints_timed + checkpoints_req FROM pg_stat_bgwriter"
# The A/B of a gentler autovacuum (--vacuum-cost-delay-ms), and what the table holds after it.
SET_VACUUM_COST_DELAY_SQL = "ALTER TABLE timers SET (autovacuum_vacuum_cost_delay = {})"
VACUUM_COST_DELAY_SQL = """
SELECT o.option_value::float8 FROM pg_class c, pg_options_to_table(c.reloptions) o
WHERE c.oid = 'timers'::regclass AND o.option_name = 'autovacuum_vacuum_cost_delay'
"""
IDLE_CHECKPOINTER = (None, "CheckpointerMain")  # its wait between checkpoints
# SAMPLE_SQL's columns, in order: the fields of a Sample it fills.
SAMPLED = (
    "at", "table_bytes", "index_bytes", "live", "dead", "deleted", "autovacuums", "autoanalyzes",
    "wal_bytes", "wal_file", "vacuum_phase", "checkpointer", "deleting", "wal_fpi", "analyze_phase",
    "longest",
)  # fmt: skip


@dataclass
class Sample:
    """One second of the server and the machine: counters as read (deltas come later)."""

    at: float
    table_bytes: int
    index_bytes: int
    live: int
    dead: int
    deleted: int
    autovacuums: int
    autoanalyzes: int
    wal_bytes: int
    wal_file: str
    vacuum_phase: str | None
    checkpointer: str | None
    deleting: int  # DELETE statements running at the moment of the sample
    wal_fpi: int
    analyze_phase: str | None
    longest: str | None  # the longest-running statement in the run's database right then: "<ms> ms <text>"
    checkpoints: int
    rss_mb: float  # the largest replica's
    pg_cpu_s: float
    replicas_cpu_s: float
    load_1m: float
    iowait_s: float = float("nan")  # the machine's, all CPUs, so far (/proc/stat)
    steal_s: float = float("nan")
    cpu_loop_ms: float = float("nan")  # the probe's run nearest before this sample


@dataclass
class Load:
    """What the producers sent and JetStream accepted: due times by key, the cancelled keys, and
    those that must fire (kept as they change: a set difference of the whole run at its end would
    stall the producers and the sampler)."""

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
        """`rate` schedules and a tenth as many cancels a second for `seconds`, sent every TICK_S
        (a slow send is caught up at the next tick, so the rates hold on average)."""
        started = time.monotonic()
        recent: deque[str] = deque(maxlen=self.rate * 2)  # the last two seconds' keys
        scheduled = cancels = 0
        while (elapsed := time.monotonic() - started) < seconds:
            now = time.time()
            batch: list[dict[str, Any]] = []
            for i in range(scheduled, int(self.rate * elapsed)):
                key = KEY_PREFIX + hashlib.md5(str(i).encode()).hexdigest()  # 34 characters, unordered
                due = now + random.uniform(*lead)
                batch.append({"tenantId": f"tenant-{i % FULL_TENANTS}", "serviceCallId": key, "dueAt": due})
            scheduled += len(batch)
            await self._schedule(client, batch)
            recent.extend(b["serviceCallId"] for b in batch)
            wanted = int(CANCELLED * self.rate * elapsed) - cancels
            # Only timers due `margin` from now or later: intake applies a cancel in milliseconds,
            # so one that fired anyway was fired after its cancel was applied, not before.
            victims = [k for k in recent if self.due.get(k, 0.0) - now >= margin and k not in self.cancelled]
            victims = random.sample(victims, min(wanted, len(victims)))
            cancels += len(victims)
            await self._cancel(client, victims)
            await asyncio.sleep(max(0.0, TICK_S - (time.monotonic() - started - elapsed)))

    async def _schedule(self, client: TimerClient, batch: list[dict[str, Any]]) -> None:
        if not batch:
            return
        for b in batch:
            b["dueAt"] = datetime.fromtimestamp(b["dueAt"], UTC)
        sent = await client.schedule_many(batch)
        for b, s in zip(batch, sent, strict=True):
            key = b["serviceCallId"]
            self.tenant[key] = b["tenantId"]
            if s.outcome == "accepted":
                self.due[key] = b["dueAt"].timestamp()
                self.expected.add(key)
                self.last_due = max(self.last_due, self.due[key])
            else:
                self.unsure.add(key)

    async def _cancel(self, client: TimerClient, keys: list[str]) -> None:
        if not keys:
            return
        sent = await client.cancel_many([{"tenantId": self.tenant[k], "serviceCallId": k} for k in keys])
        for k, s in zip(keys, sent, strict=True):
            (self.cancelled if s.outcome == "accepted" else self.unsure).add(k)
            self.expected.discard(k)


class Receipts:
    """The first receipt of each key of this run, (due, received), taken from the consumer's
    process as it writes them, a few hundred at a time (each second), never all at once."""

    def __init__(self, receiver: Receiver, load: Load) -> None:
        self.receiver, self.load = receiver, load
        self.first: dict[str, tuple[float, float]] = {}
        self.of_expected = 0  # first receipts of keys that were expected when they came

    def absorb(self) -> None:
        for key, due, received in self.receiver.take():
            if key.startswith(KEY_PREFIX) and key not in self.first:
                self.first[key] = (due, received)
                self.of_expected += key in self.load.expected
        # Everything kept so far is kept to the end: out of the collector's sight, so that its
        # full collections, which walk every tracked object, stay as short as at the start
        # instead of pausing this process (its producers and its sampler) longer and longer.
        gc.freeze()


class Sampler:
    """Once a second until stopped: a Sample of Postgres (one query), the replicas, the machine."""

    def __init__(self, rig: Rig, backend_pid: int, checkpoints_sql: str, receipts: Receipts) -> None:
        self.rig = rig
        self.receipts = receipts
        self.postmaster = int(_stat(backend_pid)[1])
        self.checkpoints_sql = checkpoints_sql
        self.samples: list[Sample] = []

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            row = await (await self.rig.db_.execute(SAMPLE_SQL)).fetchone()
            checkpoints = int(await self.rig.scalar(self.checkpoints_sql))
            assert row is not None
            rss = self.rig.rss_mb()
            iowait_s, steal_s = machine_waits_s()
            self.samples.append(
                Sample(
                    **dict(zip(SAMPLED, row, strict=True)),
                    checkpoints=checkpoints,
                    rss_mb=max(rss.values(), default=0.0),
                    pg_cpu_s=self._pg_cpu_s(),
                    replicas_cpu_s=self.rig.cpu_s(),
                    load_1m=os.getloadavg()[0],
                    iowait_s=iowait_s,
                    steal_s=steal_s,
                )
            )
            self.receipts.absorb()
            await asyncio.sleep(max(0.0, SAMPLE_S - (time.monotonic() - started)))

    def _pg_cpu_s(self) -> float:
        """The Postgres server's CPU so far: the postmaster, the processes that ended (its cutime)
        and those running, found through its children list (not a walk of /proc: this runs
        once a second beside the producers, and must stay short)."""
        tick = os.sysconf("SC_CLK_TCK")
        try:
            f = _stat(self.postmaster)
            children = Path(f"/proc/{self.postmaster}/task/{self.postmaster}/children").read_text().split()
        except OSError:
            return float("nan")
        total = sum(int(x) for x in f[11:15])
        for pid in children:
            try:
                c = _stat(int(pid))
            except OSError:
                continue  # ended meanwhile: in the postmaster's cutime
            total += int(c[11]) + int(c[12])
        return total / tick


def machine_waits_s(stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(iowait, steal): the seconds all the machine's CPUs spent so far waiting on I/O and taken
    by the hypervisor, from /proc/stat's first line, `cpu user nice system idle iowait irq softirq
    steal ...` in clock ticks. NaN where there is no such file."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return math.nan, math.nan
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[5]) / tick, int(fields[8]) / tick


class CpuProbe:
    """tools/bench/calibrate.py's probe in its own process: (epoch, loop ms) once a second."""

    def __init__(self) -> None:
        self.runs: list[tuple[float, float]] = []
        self.proc: asyncio.subprocess.Process | None = None
        self._reading: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await python_child("from tools.bench.calibrate import probe; probe()")
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


def lateness_by_second(firings: list[tuple[str, float, float]]) -> dict[int, list[float]]:
    """Lateness in ms of each first receipt, by the second its timer came due: [(key, due, received)]."""
    out: dict[int, list[float]] = {}
    for _key, due, received in firings:
        out.setdefault(int(due), []).append((received - due) * 1000)
    return out


def seconds_table(samples: list[Sample], probe: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Each sample with what changed since the one before (the second it covers)."""
    out: list[dict[str, Any]] = []
    runs = iter(probe)
    run = next(runs, None)
    for before, s in itertools.pairwise(samples):
        loop = []
        while run is not None and run[0] <= s.at:
            if run[0] > before.at:
                loop.append(run[1])
            run = next(runs, None)
        out.append(
            {
                "second": int(s.at),
                "table_mb": s.table_bytes / 2**20,
                "index_mb": s.index_bytes / 2**20,
                "dead": s.dead,
                "deleted": s.deleted - before.deleted,
                "deleting": s.deleting,
                "autovacuums": s.autovacuums - before.autovacuums,
                "autoanalyzes": s.autoanalyzes - before.autoanalyzes,
                "vacuum_phase": s.vacuum_phase,
                "analyze_phase": s.analyze_phase,
                "longest": s.longest,
                "checkpointer": s.checkpointer,
                "checkpoints": s.checkpoints - before.checkpoints,
                "wal_mb": (s.wal_bytes - before.wal_bytes) / 2**20,
                "wal_fpi": s.wal_fpi - before.wal_fpi,
                "wal_switch": int(s.wal_file != before.wal_file),
                "rss_mb": s.rss_mb,
                "pg_cpu": (s.pg_cpu_s - before.pg_cpu_s) / (s.at - before.at),
                "replicas_cpu": (s.replicas_cpu_s - before.replicas_cpu_s) / (s.at - before.at),
                "load_1m": s.load_1m,
                "iowait": (s.iowait_s - before.iowait_s) / (s.at - before.at),
                "steal": (s.steal_s - before.steal_s) / (s.at - before.at),
                "cpu_loop_ms": max(loop) if loop else float("nan"),
            }
        )
    return out


def windows(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], start: float, width: float
) -> list[dict[str, Any]]:
    """One row per `width` seconds from `start`: lateness of the timers due in it, and its seconds."""
    rows: list[dict[str, Any]] = []
    last = max([*late, *(s["second"] for s in seconds)], default=int(start))
    i = 0
    while start + i * width <= last:
        lo, hi = start + i * width, start + (i + 1) * width
        ms = [x for sec, xs in late.items() if lo <= sec < hi for x in xs]
        secs = [s for s in seconds if lo <= s["second"] < hi]
        i += 1
        if not secs and not ms:
            continue
        loops = [s["cpu_loop_ms"] for s in secs if s["cpu_loop_ms"] == s["cpu_loop_ms"]]
        rows.append(
            {
                "t_s": lo - start,
                "fires": len(ms),
                "p50_ms": percentile(ms, 50),
                "p99_ms": percentile(ms, 99),
                "max_ms": max(ms, default=float("nan")),
                "table_mb": secs[-1]["table_mb"] if secs else float("nan"),
                "index_mb": secs[-1]["index_mb"] if secs else float("nan"),
                "dead": secs[-1]["dead"] if secs else 0,
                "deleted": sum(s["deleted"] for s in secs),
                "autovacuums": sum(s["autovacuums"] for s in secs),
                "vacuum_s": sum(1 for s in secs if s["vacuum_phase"]),
                "autoanalyzes": sum(s["autoanalyzes"] for s in secs),
                "checkpoints": sum(s["checkpoints"] for s in secs),
                "checkpointer_s": sum(1 for s in secs if s["checkpointer"] not in IDLE_CHECKPOINTER),
                "wal_mb": sum(s["wal_mb"] for s in secs),
                "wal_switches": sum(s["wal_switch"] for s in secs),
                "rss_mb": max((s["rss_mb"] for s in secs), default=float("nan")),
                "pg_cpu": statistics.fmean(s["pg_cpu"] for s in secs) if secs else float("nan"),
                "cpu_loop_ms_p50": statistics.median(loops) if loops else float("nan"),
                "cpu_loop_ms_max": max(loops, default=float("nan")),
                "load_1m": secs[-1]["load_1m"] if secs else float("nan"),
                "steal_max": max((s["steal"] for s in secs if not math.isnan(s["steal"])), default=math.nan),
            }
        )
    return rows


WINDOW_COLUMNS = (
    ("t_s", "t (s)", "{:.0f}"),
    ("fires", "fires", "{:,}"),
    ("p50_ms", "p50 ms", "{:.1f}"),
    ("p99_ms", "p99 ms", "{:.1f}"),
    ("max_ms", "max ms", "{:.0f}"),
    ("table_mb", "heap MB", "{:.0f}"),
    ("index_mb", "indexes MB", "{:.0f}"),
    ("dead", "dead rows", "{:,}"),
    ("deleted", "deleted", "{:,}"),
    ("autovacuums", "autovacuums", "{}"),
    ("vacuum_s", "vacuum s", "{}"),
    ("autoanalyzes", "autoanalyzes", "{}"),
    ("checkpoints", "checkpoints", "{}"),
    ("checkpointer_s", "checkpointer s", "{}"),
    ("wal_mb", "WAL MB", "{:.1f}"),
    ("wal_switches", "WAL segs", "{}"),
    ("rss_mb", "RSS MB", "{:.0f}"),
    ("pg_cpu", "pg cores", "{:.2f}"),
    ("cpu_loop_ms_p50", "loop p50 ms", "{:.0f}"),
    ("cpu_loop_ms_max", "loop max ms", "{:.0f}"),
    ("load_1m", "load", "{:.1f}"),
    ("steal_max", "steal max cores", "{:.2f}"),
)


def window_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| " + " | ".join(title for _, title, _ in WINDOW_COLUMNS) + " |",
        "|" + "---|" * len(WINDOW_COLUMNS),
    ]
    for r in rows:
        cells = [fmt.format(r[k]) if r[k] == r[k] else "-" for k, _, fmt in WINDOW_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def factors(s: dict[str, Any], wal_typical: float, loop_typical: float) -> list[str]:
    """What went on in one second that could slow a claim, by name."""
    out = []
    if s["vacuum_phase"]:
        out.append(f"autovacuum ({s['vacuum_phase']})")
    if s["autovacuums"]:
        out.append("autovacuum done")
    if s["analyze_phase"]:
        out.append(f"autoanalyze ({s['analyze_phase']})")
    if s["checkpointer"] not in IDLE_CHECKPOINTER:
        out.append(f"checkpointer ({s['checkpointer']})")
    if s["checkpoints"]:
        out.append("checkpoint done")
    if s["deleted"] or s["deleting"]:
        out.append("retention delete")
    if s["wal_switch"]:
        out.append("WAL segment switch")
    if s["wal_mb"] > 2 * wal_typical:
        out.append("WAL burst")
    if s["cpu_loop_ms"] > 1.5 * loop_typical:
        out.append("machine (loop slow)")
    if s["steal"] >= STOLEN_CORES:
        out.append(f"steal ({s['steal']:.2f} cores)")
    if s["iowait"] >= STOLEN_CORES:
        out.append(f"iowait ({s['iowait']:.2f} cores)")
    if s["autoanalyzes"]:
        out.append("autoanalyze done")
    if s["longest"] and int(s["longest"].split()[0]) >= LONG_STATEMENT_MS:
        out.append(f"long statement ({s['longest']})")
    return out


def attribution(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], target: float
) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """Each second with a timer later than `target`, beside what went on in it or the second
    before (a stall delays what comes due while it lasts and just after); and per kind of thing,
    (slow seconds it went with, all seconds it went on in), so the report can say which of them
    turns up in slow seconds more often than in any."""
    by_second = {s["second"]: s for s in seconds}
    wal_typical = statistics.median([s["wal_mb"] for s in seconds] or [0.0])
    loops = [s["cpu_loop_ms"] for s in seconds if s["cpu_loop_ms"] == s["cpu_loop_ms"]]
    loop_typical = statistics.median(loops or [float("inf")])

    def around(sec: int, detail: bool = False) -> list[str]:
        found: list[str] = []
        for t in (sec - 1, sec):
            for f in factors(by_second[t], wal_typical, loop_typical) if t in by_second else []:
                f = f if detail else f.split(" (")[0]
                if f not in found:
                    found.append(f)
        return found

    lines, counts = [], {}
    slow = sorted(sec for sec, xs in late.items() if max(xs) > target and sec in by_second)
    for sec in slow:
        s = by_second[sec]
        lines.append(
            f"{time.strftime('%H:%M:%S', time.gmtime(sec))} max {max(late[sec]):.0f} ms"
            f" ({len(late[sec])} due): {', '.join(around(sec, detail=True)) or 'nothing sampled'}"
            f"; loop {s['cpu_loop_ms']:.0f} ms, pg {s['pg_cpu']:.2f} cores, load {s['load_1m']:.1f}"
        )
    every = [around(s["second"]) for s in seconds]
    for name in sorted({n for e in every for n in e}):
        counts[name] = (sum(1 for sec in slow if name in around(sec)), sum(1 for e in every if name in e))
    counts["nothing sampled"] = (
        sum(1 for sec in slow if not around(sec)),
        sum(1 for e in every if not e),
    )
    return lines, counts


def quiet_lateness(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], until: float
) -> tuple[int, float]:
    """The service's own lateness, as near as a shared machine shows it: the timers due in seconds
    (before `until`) when the calibration loop, in that second and the one before, took at most
    QUIET_LOOP times its 10th percentile over the run. (How many such seconds, their p99.)"""
    loops = sorted(s["cpu_loop_ms"] for s in seconds if s["cpu_loop_ms"] == s["cpu_loop_ms"])
    if not loops:
        return 0, float("nan")
    bound = QUIET_LOOP * loops[len(loops) // 10]
    loop = {s["second"]: s["cpu_loop_ms"] for s in seconds}
    quiet = [s for s in late if s < until and max(loop.get(s, math.inf), loop.get(s - 1, math.inf)) <= bound]
    return len(quiet), percentile([x for sec in quiet for x in late[sec]], 99)


async def soak(ctx: Context) -> Metrics:
    rows = ctx.n(FULL_ROWS)
    duration = ctx.seconds(900, floor=20)
    width = ctx.seconds(30, floor=5)
    lead = (ctx.seconds(10, floor=2), ctx.seconds(130, floor=6))
    margin = ctx.seconds(30, floor=3)
    # Not scaled: the command stream's 2-minute duplicate window (streams.py) bounds the commands'
    # max age from below, and retention may not be shorter than that (config.py).
    retention = 120
    settings = {"retention": "2m", "command_max_age": "2m", "stuck_after": "1m"}
    async with ctx.rig(**settings) as rig:
        ctx.progress(f"building a table of {rows:,} pending timers")
        await asyncio.to_thread(build_realistic, rig.db_url, rows, FULL_TENANTS)
        vacuum_cost_delay = await _vacuum_cost_delay(rig, ctx.vacuum_cost_delay_ms, ctx.progress)
        names = rig.start_replicas(ctx.replicas)
        await rig.wait_replicas_up(names)
        async with Receiver(rig.workdir / "receipts.jsonl") as receiver:
            await receiver.start(
                ctx.nats_url, rig.names["subject_prefix"], rig.names["event_stream"], "bench-receiver"
            )
            pid = int(await rig.scalar(BACKEND_PID_SQL))
            version = int(await rig.scalar("SHOW server_version_num"))
            load = Load(ctx.soak_rate or RATE)
            receipts = Receipts(receiver, load)
            checkpoints = CHECKPOINTS_SQL if version >= 170000 else CHECKPOINTS_SQL_16
            sampler = Sampler(rig, pid, checkpoints, receipts)
            probe = CpuProbe()
            await probe.start()
            stop = asyncio.Event()
            sampling = asyncio.create_task(sampler.run(stop))
            client = await TimerClient.connect(ctx.nats_url, rig.names["subject_prefix"])
            start = time.time()
            try:
                async with client:
                    ctx.progress(
                        f"{load.rate}/s scheduled and {CANCELLED * load.rate:.0f}/s cancelled"
                        f" for {duration:.0f}s,"
                        f" due {lead[0]:.0f}-{lead[1]:.0f}s ahead, retention {retention:.0f}s"
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
    result = _result(ctx, rows, start, width, duration, load, receipts.first, sampler, probe)
    return result | {"vacuum_cost_delay_ms": vacuum_cost_delay, "rate": load.rate}


async def _vacuum_cost_delay(rig: Rig, ms: float | None, progress: Progress) -> float:
    """Sets `timers`' autovacuum_vacuum_cost_delay to `ms` (None: leaves the migrations' own);
    what the table holds then, read back (nan: none of its own, the server's applies)."""
    if ms is not None:
        await rig.db_.execute(sql.SQL(SET_VACUUM_COST_DELAY_SQL).format(sql.Literal(str(ms))))
    held = await rig.scalar(VACUUM_COST_DELAY_SQL)
    value = float("nan") if held is None else float(held)
    source = "set by --vacuum-cost-delay-ms" if ms is not None else "as the migrations left it"
    progress(
        "autovacuum_vacuum_cost_delay of timers: "
        + ("the server's (none of the table's own)" if held is None else f"{value:g} ms ({source})")
    )
    return value


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
    """Until every expected key was received (the sampler takes them in), or the deadline;
    RuntimeError if the consumer's process ended meanwhile (its error went to stderr)."""
    while (missing := len(receipts.load.expected) - receipts.of_expected) > 0 and time.time() < deadline_at:
        if (status := receipts.receiver.exited) is not None:
            raise RuntimeError(
                f"the soak's consumer exited (status {status}) with {missing:,} timers to fire"
            )
        progress(f"waiting for {missing:,} timers to fire")
        await asyncio.sleep(1)


def _result(
    ctx: Context,
    rows: int,
    start: float,
    width: float,
    duration: float,
    load: Load,
    received: dict[str, tuple[float, float]],
    sampler: Sampler,
    probe: CpuProbe,
) -> Metrics:
    firings = [(k, due, got) for k, (due, got) in received.items()]
    late = lateness_by_second(firings)
    seconds = seconds_table(sampler.samples, probe.runs)
    table = windows(seconds, late, start, width)
    slow, counts = attribution(seconds, late, TARGET_P99_MS)
    for line in window_table(table):
        ctx.progress(line)
    ctx.progress(f"seconds with a timer later than {TARGET_P99_MS:.0f} ms, and what went on in them:")
    for line in slow:
        ctx.progress("  " + line)
    for name, (in_slow, in_all) in counts.items():
        ctx.progress(f"  {name}: in {in_slow} of {len(slow)} slow seconds, {in_all} of {len(seconds)}")
    if out := os.environ.get("BENCH_SOAK_SECONDS"):
        Path(out).write_text(
            json.dumps({"seconds": seconds, "lateness_ms": late, "windows": table, "slow": slow})
        )
    all_ms = [x for xs in late.values() for x in xs]
    quiet_seconds, quiet_p99 = quiet_lateness(seconds, late, start + duration)
    full = [w for w in table if w["t_s"] + width <= duration and w["fires"]]  # windows of the load
    half = [w for w in full if w["t_s"] >= duration / 2]
    return {
        "rows": rows,
        "seconds": duration,
        "scheduled": len(load.due),
        "cancelled": len(load.cancelled),
        "fired": len(received.keys() & load.expected),
        "lost": len(load.expected - received.keys()),
        "cancelled_fired": len(received.keys() & load.cancelled),
        "send_errors": len(load.unsure),
        "early": sum(1 for x in all_ms if x < 0),
        "lateness_p50_ms": percentile(all_ms, 50),
        "lateness_p99_ms": percentile(all_ms, 99),
        "lateness_max_ms": max(all_ms, default=float("nan")),
        "windows": len(full),
        "max_window_p99_ms": max((w["p99_ms"] for w in full), default=float("nan")),
        "slow_windows": sum(1 for w in full if w["p99_ms"] > TARGET_P99_MS),
        # The machine's share set aside: the seconds of the load when the calibration loop was quiet.
        "quiet_seconds": quiet_seconds,
        "quiet_p99_ms": quiet_p99,
        "autovacuums": sum(s["autovacuums"] for s in seconds),
        "checkpoints": sum(s["checkpoints"] for s in seconds),
        "wal_mb": sum(s["wal_mb"] for s in seconds),
        "deleted": sum(s["deleted"] for s in seconds),
        # Flat once retention deletes as fast as timers finish: growth over the second half.
        "size_growth_mb": _growth(half, "table_mb") + _growth(half, "index_mb"),
        "rss_growth_mb": _growth(half, "rss_mb"),
        "rss_max_mb": max((s["rss_mb"] for s in seconds), default=0.0),
        # A window the probe had not reached yet (its process starts late on a busy machine) has
        # nan, which max() would return if it came first.
        "cpu_loop_ms_max": max(
            (w["cpu_loop_ms_max"] for w in full if not math.isnan(w["cpu_loop_ms_max"])), default=float("nan")
        ),
    }


def _growth(rows: list[dict[str, Any]], key: str) -> float:
    return float(rows[-1][key] - rows[0][key]) if len(rows) > 1 else 0.0
