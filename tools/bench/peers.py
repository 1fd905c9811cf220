"""`make bench-peers`: this service beside graphile-worker, pgqueuer and NATS message schedules.

The same two workloads for each, on one embedded Postgres and one embedded NATS, in one run:

- drain: N jobs already overdue; the workers start after the insert; fires/s from the first to
  the last receive. On each table shape of tools/bench/shapes.py (fresh; a burst into a big
  table of future jobs; the due jobs scattered through it; a burst into the big table after
  retention's churn), each system's own table built its own way (NATS schedules have no table:
  fresh only).
- lateness: R come due per second for S seconds, the workers already running; receive time
  minus due time.

A receive is what a user's code sees: for this service a JetStream consumer of DueTimeReached
(in this process, as a user's service would be: the client's `due_events` for `timer-service`, a
plain nats-py push consumer in a deliver group for `timer-service-push`), for graphile-worker and
pgqueuer their no-op handler, for NATS schedules a JetStream consumer of the target subject. CPU
is every process's user + system time from /proc (Postgres with its backends, NATS, the workers,
the consumer), taken from the first receive to the last, so start-up is not counted; and the WAL
Postgres wrote meanwhile. The peers are installed (npm, a pip venv) into a throwaway directory
each time: nothing lands in the project's venv.

    .venv/bin/python -m tools.bench.peers --runs 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast

import nats
import psycopg
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from tools.bench import invocation
from tools.bench.calibrate import calibrate, describe
from tools.bench.realistic import DUE_AT_SQL
from tools.bench.rig import Rig, machine
from tools.bench.shapes import FULL_BIG, SHAPES, TIMERS, WAL_LSN_SQL, AddJobs, JobTable, add_timers, build
from worker.client.consumer import DueEvent
from worker.contract import Subjects
from worker.devkit.harness import percentile
from worker.devkit.recorder import Recorder

# The peers' programs, run as they are from the repository (the peers themselves are installed
# into a throwaway directory): a graphile-worker task and a pgqueuer entrypoint, each a no-op that
# records when it ran.
PROGRAMS = Path(__file__).resolve().parent / "programs"
GRAPHILE_WORKER = "graphile-worker@0.18"
PGQUEUER = "pgqueuer[asyncpg]"
SYSTEMS = ("timer-service", "timer-service-push", "graphile-worker", "pgqueuer", "nats-schedules")
REFERENCE = "graphile-worker"  # every drain's rate is also given as a ratio to its, round by round
PROG = "python -m tools.bench.peers"
WORKERS = 2  # worker processes for each peer (--replicas for this service)

Receipt = tuple[float, float]  # (due, received), epoch seconds on this machine's clock
Progress = Callable[[str], None]


# -- what a run measured, and the table ----------------------------------------------------------
@dataclass
class Measured:
    receipts: list[Receipt]
    cpu_s: dict[str, float]  # component -> CPU seconds between the first and the last receive
    fires_in_window: int  # receipts between those two CPU readings
    wal_bytes: float = float("nan")  # WAL Postgres wrote between those two readings
    due_pages: float = float("nan")  # heap pages the due jobs sat on before a drain


def drain_rate(receipts: list[Receipt]) -> float:
    """Fires per second from the first receive to the last."""
    times = [r for _, r in receipts]
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else float("nan")


def lateness_ms(receipts: list[Receipt]) -> dict[str, float]:
    late = [(r - d) * 1000 for d, r in receipts]
    return {
        "p50_ms": percentile(late, 50),
        "p99_ms": percentile(late, 99),
        "max_ms": max(late, default=float("nan")),
    }


def cpu_ms_per_1k(m: Measured) -> dict[str, float]:
    """CPU milliseconds per 1,000 fires, per component and in total."""
    per = {k: v / max(m.fires_in_window, 1) * 1e6 for k, v in m.cpu_s.items()}
    return {**per, "total": sum(per.values())}


def _drain_summary(rounds: list[dict[str, Any]], reference: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One system's drains of one shape over its rounds; `reference`: graphile-worker's, round by
    round (its rate in the same round is the ratio's denominator: a slow minute of the machine
    hits both)."""
    rates = [r["fires_per_s"] for r in rounds]
    ratios = [r["fires_per_s"] / g["fires_per_s"] for r, g in zip(rounds, reference or [], strict=False)]
    return {
        "fires_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "over_reference": statistics.median(ratios) if ratios else float("nan"),
        "over_reference_rounds": ratios,
        "cpu_ms_per_1k": {
            k: statistics.median(r["cpu_ms_per_1k"][k] for r in rounds) for k in rounds[0]["cpu_ms_per_1k"]
        },
        "wal_bytes_per_fire": statistics.median(r.get("wal_bytes_per_fire", float("nan")) for r in rounds),
        "due_pages": statistics.median(r.get("due_pages", float("nan")) for r in rounds),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per system: per table shape its drain's medians, range and ratio to graphile-worker's, and
    its lateness' medians."""
    out: dict[str, dict[str, Any]] = {}
    for system, rs in runs.items():
        drains: dict[str, Any] = {}
        for shape in rs[0]["drain"]:
            reference = [r["drain"].get(shape) for r in runs.get(REFERENCE, [])]
            drains[shape] = _drain_summary(
                [r["drain"][shape] for r in rs], reference if all(reference) else None
            )
        out[system] = {
            "drain": drains,
            "lateness": {
                k: statistics.median(r["lateness"][k] for r in rs) for k in ("p50_ms", "p99_ms", "max_ms")
            },
        }
    return out


def _n(x: float) -> str:
    return "n/a" if x != x else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def _ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def table(report: dict[str, Any]) -> str:
    """Markdown tables: each system's drain on each shape (rate, its ratio to graphile-worker's
    round by round, CPU per 1,000 fires by component, WAL per fire, the heap pages the due rows
    sat on), then lateness."""
    cfg = report["config"]
    lines = [
        f"{report['command']}  ({cfg['runs']} runs; drain {cfg['drain_n']:,} overdue, big table "
        f"{cfg['big']:,}; lateness {cfg['rate']:,}/s for {cfg['seconds']:.0f} s; {cfg['replicas']} "
        f"replicas of ours, {WORKERS} worker processes for each peer"
        + "".join(f"; {k}={v}" for k, v in cfg.get("pg_settings", {}).items())
        + ")",
        *(describe(c) for c in report["calibration"]),
        "",
        f"| system | table | drain fires/s (median) | min .. max | ÷ {REFERENCE} by round (median) "
        "| CPU ms per 1,000 (total: postgres / nats / workers / consumer) | WAL bytes per fire "
        "| heap pages of the due jobs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, s in report["summary"].items():
        for shape, d in s["drain"].items():
            c = d["cpu_ms_per_1k"]
            parts = " / ".join(_n(c.get(k, 0.0)) for k in ("postgres", "nats", "workers", "consumer"))
            rounds = ", ".join(_ratio(x) for x in d["over_reference_rounds"])
            lines.append(
                f"| {system} | {shape} | {_n(d['fires_per_s'])} | {_n(d['min'])} .. {_n(d['max'])} "
                f"| {rounds} (**{_ratio(d['over_reference'])}**) | {_n(c['total'])}: {parts} "
                f"| {_n(d['wal_bytes_per_fire'])} | {_n(d['due_pages'])} |"
            )
    lines += ["", "| system | lateness p50 / p99 / max ms |", "|---|---|"]
    for system, s in report["summary"].items():
        late = s["lateness"]
        lines.append(f"| {system} | {_n(late['p50_ms'])} / {_n(late['p99_ms'])} / {_n(late['max_ms'])} |")
    return "\n".join(lines)


# -- CPU from /proc --------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds of the process and of its children it has waited for)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    ticks = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    return int(fields[1]), ticks / os.sysconf("SC_CLK_TCK")


ProcTable = tuple[dict[int, float], dict[int, list[int]]]  # CPU seconds by pid; children by pid


def proc_table() -> ProcTable:
    """Every process's CPU seconds and children, from one pass over /proc."""
    cpu: dict[int, float] = {}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))):
            cpu[int(entry)] = st[1]
            children.setdefault(st[0], []).append(int(entry))
    return cpu, children


def tree_cpu_s(roots: list[int], table: ProcTable | None = None) -> float:
    """CPU seconds of these processes and all their descendants, live or already reaped."""
    cpu, children = table or proc_table()
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in cpu:
            continue
        seen.add(pid)
        total += cpu[pid]
        todo.extend(children.get(pid, []))
    return total


# -- the servers everyone shares -------------------------------------------------------------------
@dataclass
class Shared:
    admin_url: str  # the postgres database
    nats_url: str
    pg_pid: int
    nats_pid: int
    workdir: Path
    tools: Path  # node_modules and the pgqueuer venv
    progress: Progress

    def pids(self) -> dict[str, list[int]]:
        return {"postgres": [self.pg_pid], "nats": [self.nats_pid]}

    def fresh_db(self) -> tuple[str, str]:
        name = f"peer_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return name, self.admin_url.rsplit("/", 1)[0] + f"/{name}"

    def drop_db(self, name: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class Meter:
    """CPU per component, and the WAL written, between the first receive and the last."""

    def __init__(self, shared: Shared, workers: Callable[[], list[int]], consumer: bool) -> None:
        self.pids = shared.pids()
        self.consumer = consumer  # False: the peer's handler runs in its workers, not in this process
        self.workers = workers
        self.first: dict[str, float] | None = None
        self.first_count = 0
        self.first_wal = 0
        # Opened now: a connection opened at the first receive would stall this process's consumer.
        self.db = psycopg.connect(shared.admin_url, autocommit=True)

    def wal(self) -> int:
        row = self.db.execute(WAL_LSN_SQL).fetchone()
        return int(row[0]) if row else 0

    def read(self) -> dict[str, float]:
        table = proc_table()
        cpu = {k: tree_cpu_s(v, table) for k, v in self.pids.items()}
        cpu["workers"] = tree_cpu_s(self.workers(), table)
        if self.consumer:
            # This process alone: the servers and the workers are its children, counted above.
            cpu["consumer"] = time.process_time()
        return cpu

    def observe(self, count: int) -> None:
        """Called while polling; takes the first reading at the first receive seen."""
        if self.first is None and count > 0:
            self.first, self.first_count, self.first_wal = self.read(), count, self.wal()

    def result(self, receipts: list[Receipt] | Callable[[], list[Receipt]]) -> Measured:
        """The CPU and WAL since the first receive; `receipts` may be made after they are read."""
        last, wal = self.read(), self.wal()
        self.db.close()
        first = self.first or last
        got = receipts() if callable(receipts) else receipts
        window = max(len(got) - self.first_count, 1)
        return Measured(got, {k: last[k] - first[k] for k in last}, window, wal - self.first_wal)


async def _wait(
    count: Callable[[], int], n: int, timeout: float, meter: Meter, progress: Progress, what: str
) -> None:
    deadline = time.monotonic() + timeout
    shown = time.monotonic()
    while (got := count()) < n:
        meter.observe(got)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: only {got:,} of {n:,} received in {timeout:.0f} s")
        if time.monotonic() - shown > 5:
            progress(f"{what}: {got:,}/{n:,}")
            shown = time.monotonic()
        await asyncio.sleep(0.02)
    meter.observe(got)


# -- the systems -----------------------------------------------------------------------------------
class System(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def shapes(self) -> tuple[str, ...]:
        """The table shapes it has (NATS schedules: no table)."""

    async def drain(self, n: int, shape: str, big: int) -> Measured: ...

    async def lateness(self, rate: int, seconds: float) -> Measured: ...


def _lead_s(n: int) -> float:
    """How far ahead the first of n timers is due: the insert or publish must be over by then."""
    return 3 + n / 5000


def _drain_timeout(n: int) -> float:
    return 120 + n / 200  # pgqueuer's drain of scattered jobs went at 400/s (issue 37)


@dataclass
class Ours:
    shared: Shared
    replicas: int
    push: bool = False  # a plain nats-py push consumer instead of the client's due_events
    shapes: tuple[str, ...] = SHAPES

    @property
    def name(self) -> str:
        return "timer-service-push" if self.push else "timer-service"

    async def drain(self, n: int, shape: str, big: int) -> Measured:
        async with Rig(self.shared.admin_url, self.shared.nats_url, self.shared.workdir) as rig:
            pages = await asyncio.to_thread(build, shape, rig.db_url, add_timers(rig), TIMERS, n, big)
            measured = await self._measure(rig, n, None, timeout=_drain_timeout(n))
            measured.due_pages = pages
            return measured

    async def lateness(self, rate: int, seconds: float) -> Measured:
        n = int(rate * seconds)
        async with Rig(self.shared.admin_url, self.shared.nats_url, self.shared.workdir) as rig:
            names = rig.start_replicas(self.replicas)
            await rig.wait_replicas_up(names)
            seed = rig.seed(n, start_s=_lead_s(n), rate=rate, key_prefix="l-")
            return await self._measure(rig, n, seed, timeout=seconds + 120)

    async def _receive(self, rig: Rig) -> tuple[list[tuple[dict[str, Any], float]], Callable[[], Any]]:
        """What a user's consumer gets, each event decoded and acknowledged, and nothing more until
        the end (the bookkeeping of the EventRecorder the tests use cost a fifth of a consumer's
        CPU): (event, receive time) as they come, and how to stop receiving."""
        subject, stream = Subjects(rig.names["subject_prefix"]).due("*"), rig.names["event_stream"]
        if self.push:  # the consumer most users would write with nats-py: explicit acks, a deliver group
            records: list[tuple[dict[str, Any], float]] = []

            async def on_msg(msg: Msg) -> None:
                records.append((json.loads(msg.data), time.time()))
                await msg.ack()

            js = rig.nc_.jetstream()
            sub = await js.subscribe(
                subject,
                queue="bench-push",  # the deliver group, and the durable's name (nats-py)
                stream=stream,
                cb=on_msg,
                manual_ack=True,
            )
            return records, sub.unsubscribe
        recorder = Recorder(
            rig.nc_,
            subject,
            stream,
            lambda at, event: (cast(DueEvent, event).event, at),
            durable="bench-receiver",
        )
        await recorder.start()
        return recorder.records, recorder.stop

    async def _measure(self, rig: Rig, n: int, seed: Any, timeout: float) -> Measured:
        records, stop = await self._receive(rig)
        if seed is None:  # drain: the replicas start after the insert
            rig.start_replicas(self.replicas)
        else:
            await seed
        meter = Meter(self.shared, lambda: [p.pid for p in rig.fleet.procs.values()], consumer=True)
        first: dict[str, tuple[dict[str, Any], float]] = {}  # a redelivered event counts at its first receive
        seen = 0

        def count() -> int:
            nonlocal seen
            for event, at in records[seen:]:
                first.setdefault(event["id"], (event, at))
            seen = len(records)
            return len(first)

        try:
            await _wait(count, n, timeout, meter, self.shared.progress, self.name)
        finally:
            await stop()
        return meter.result(
            lambda: [
                (datetime.fromisoformat(event["payload"]["dueAt"]).timestamp(), at)
                for event, at in first.values()
            ]
        )


class FileWorkers:
    """Peer worker processes, each appending "due received" lines to its own file."""

    def __init__(self, workdir: Path, argv: Callable[[Path], list[str]], env: dict[str, str]) -> None:
        self.workdir, self.argv, self.env = workdir, argv, env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []
        self._offsets: dict[Path, int] = {}
        self.receipts: list[Receipt] = []

    def start(self, n: int) -> None:
        for i in range(len(self.procs), len(self.procs) + n):
            out = self.workdir / f"worker-{i}.receipts"
            log = open(self.workdir / f"worker-{i}.log", "ab")  # noqa: SIM115  # the child owns it
            self.procs.append(
                subprocess.Popen(self.argv(out), env=self.env, stdout=log, stderr=subprocess.STDOUT)
            )
            log.close()
            self.files.append(out)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self._all_ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"peer workers did not come up; logs in {self.workdir}")
            await asyncio.sleep(0.05)

    def _all_ready(self) -> bool:
        return all(Path(f"{f}.ready").exists() for f in self.files)

    def count(self) -> int:
        for f in self.files:
            with contextlib.suppress(FileNotFoundError), f.open("rb") as fh:
                fh.seek(self._offsets.get(f, 0))
                data = fh.read()
                whole = data[: data.rfind(b"\n") + 1]
                self._offsets[f] = self._offsets.get(f, 0) + len(whole)
                for line in whole.splitlines():
                    due, received = line.split()
                    self.receipts.append((float(due), float(received)))
        return len(self.receipts)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class _PeerOnPostgres:
    """What graphile-worker and pgqueuer share: a fresh database, N jobs, workers that write receipts."""

    name: str
    table: JobTable  # where its jobs are stored (tools/bench/shapes.py)
    shapes: tuple[str, ...] = SHAPES

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def install(self, db_url: str) -> None:
        raise NotImplementedError

    def add_jobs(self, db_url: str, rows: int, every: int, start_s: float, rate: float) -> None:
        """The peer's own insert of `rows` jobs (tools/bench/shapes.py, AddJobs)."""
        raise NotImplementedError

    def worker_argv(self, out: Path) -> list[str]:
        """The command of one worker process; it finds the database in PEER_DATABASE_URL."""
        raise NotImplementedError

    def env(self, db_url: str) -> dict[str, str]:
        """The peer's programs' environment: the database in PEER_DATABASE_URL (PGDSN for `pgq`)."""
        return {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url}

    async def drain(self, n: int, shape: str, big: int) -> Measured:
        pages = float("nan")

        def prepare(db_url: str) -> None:
            nonlocal pages
            add: AddJobs = functools.partial(self.add_jobs, db_url)
            pages = build(shape, db_url, add, self.table, n, big)

        measured = await self._run(n, prepare, after_insert=True, timeout=_drain_timeout(n))
        measured.due_pages = pages
        return measured

    async def lateness(self, rate: int, seconds: float) -> Measured:
        n = int(rate * seconds)
        return await self._run(
            n,
            lambda db_url: self.add_jobs(db_url, n, 1, _lead_s(n), rate),
            after_insert=False,
            timeout=seconds + 120,
        )

    async def _run(
        self, n: int, insert: Callable[[str], None], after_insert: bool, timeout: float
    ) -> Measured:
        dbname, db_url = self.shared.fresh_db()
        workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.shared.workdir))
        workers = FileWorkers(workdir, self.worker_argv, self.env(db_url))
        try:
            await asyncio.to_thread(self.install, db_url)
            if after_insert:
                await asyncio.to_thread(insert, db_url)
            workers.start(WORKERS)
            await workers.ready()
            if not after_insert:
                await asyncio.to_thread(insert, db_url)
            meter = Meter(self.shared, workers.pids, consumer=False)
            await _wait(workers.count, n, timeout, meter, self.shared.progress, self.name)
            return meter.result(workers.receipts)
        finally:
            await asyncio.to_thread(workers.stop)
            await asyncio.to_thread(self.shared.drop_db, dbname)


# graphile-worker's own bulk insert, jobs numbered lo .. hi, due as DUE_AT_SQL says.
GRAPHILE_INSERT = f"""
SELECT graphile_worker.add_jobs(array_agg(
  ROW('noop', json_build_object('d', extract(epoch FROM t)), NULL, t, NULL, NULL, NULL, NULL)
    ::graphile_worker.job_spec))
FROM (SELECT {DUE_AT_SQL} AS t FROM generate_series(%(lo)s::int, %(hi)s::int) AS i) AS due
"""
GRAPHILE_CHUNK = 50_000  # jobs per add_jobs call: one array per statement, of a manageable size


class GraphileWorker(_PeerOnPostgres):
    name = "graphile-worker"
    table = JobTable("graphile_worker._private_jobs", "run_at <= now()")

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self.dir = shared.tools / "graphile"

    def install(self, db_url: str) -> None:
        subprocess.run(
            [str(self.dir / "node_modules/.bin/graphile-worker"), "--schema-only", "-c", db_url],
            cwd=self.dir,
            check=True,
            capture_output=True,
        )

    def add_jobs(self, db_url: str, rows: int, every: int, start_s: float, rate: float) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            for lo in range(1, rows + 1, GRAPHILE_CHUNK):
                hi = min(lo + GRAPHILE_CHUNK - 1, rows)
                params = {"lo": lo, "hi": hi, "every": every, "start_s": start_s, "rate": rate}
                conn.execute(GRAPHILE_INSERT, params)

    def worker_argv(self, out: Path) -> list[str]:
        return ["node", str(PROGRAMS / "graphile_worker.js"), str(out)]

    def env(self, db_url: str) -> dict[str, str]:
        # The program is run where it is, in the repository: `require` finds graphile-worker in
        # the throwaway install through NODE_PATH.
        return {**super().env(db_url), "NODE_PATH": str(self.dir / "node_modules")}


class PgQueuer(_PeerOnPostgres):
    name = "pgqueuer"
    table = JobTable("pgqueuer", "execute_after <= now()")  # its default name

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self.dir = shared.tools / "pgqueuer"
        self.python = str(self.dir / "venv/bin/python")
        self.program = str(PROGRAMS / "pgqueuer_worker.py")

    def install(self, db_url: str) -> None:
        pgq = [str(self.dir / "venv/bin/pgq"), "install"]
        subprocess.run(pgq, env=self.env(db_url), check=True, capture_output=True)

    def add_jobs(self, db_url: str, rows: int, every: int, start_s: float, rate: float) -> None:
        argv = [self.python, self.program, "insert", str(rows), str(every), str(start_s), str(rate)]
        subprocess.run(argv, env=self.env(db_url), check=True, capture_output=True)

    def worker_argv(self, out: Path) -> list[str]:
        return [self.python, self.program, "work", str(out)]


def _rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass
class NatsSchedules:
    """JetStream message schedules (server 2.12+): one `@at` schedule per timer; the server fires it."""

    shared: Shared
    name: str = "nats-schedules"
    shapes: tuple[str, ...] = ("fresh",)  # no table: the server holds the schedules in a stream

    async def drain(self, n: int, shape: str, big: int) -> Measured:
        # The server is the worker and always runs: "started after the insert" means every
        # schedule comes due at one moment after the last one was stored.
        return await self._run(n, lambda i, t0: t0, timeout=120 + n / 500)

    async def lateness(self, rate: int, seconds: float) -> Measured:
        n = int(rate * seconds)
        return await self._run(n, lambda i, t0: t0 + i / rate, timeout=seconds + 120)

    async def _run(self, n: int, due: Callable[[int, float], float], timeout: float) -> Measured:
        tag = uuid.uuid4().hex[:8]
        stream, prefix = f"PEER_{tag}", f"peer{tag}"
        nc: NATS = await nats.connect(self.shared.nats_url)
        try:
            config = {
                "name": stream,
                "subjects": [f"{prefix}.sched.>", f"{prefix}.fired.>"],
                "storage": "file",
                "num_replicas": 1,
                "allow_msg_schedules": True,
            }
            create = f"$JS.API.STREAM.CREATE.{stream}"
            reply = await nc.request(create, json.dumps(config).encode(), timeout=10)
            if "error" in (created := json.loads(reply.data)):
                raise RuntimeError(f"nats-schedules: stream not created: {created['error']}")
            js = nc.jetstream(publish_async_max_pending=4000)
            recorder = Recorder(nc, f"{prefix}.fired.>", stream, lambda at, msg: (float(msg.data), at))
            await recorder.start()
            t0 = time.time() + _lead_s(n)
            futures = []
            for i in range(n):
                at = due(i, t0)
                headers = {
                    "Nats-Schedule": f"@at {_rfc3339(at)}",
                    "Nats-Schedule-Target": f"{prefix}.fired.{i}",
                }
                body = repr(at).encode()
                futures.append(await js.publish_async(f"{prefix}.sched.{i}", body, headers=headers))
            await asyncio.gather(*futures)
            if time.time() > t0:
                raise RuntimeError("nats-schedules: publishing outlasted the lead; the machine is too busy")
            meter = Meter(self.shared, lambda: [], consumer=True)
            await _wait(lambda: len(recorder.records), n, timeout, meter, self.shared.progress, self.name)
            return meter.result(list(recorder.records))
        finally:
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_stream(stream)
            await nc.close()


# -- installing the peers into the throwaway directory -----------------------------------------------
def install_peers(tools: Path, chosen: list[str], progress: Progress) -> dict[str, str]:
    """npm and pip installs into `tools` of the chosen peers; the versions installed."""
    versions: dict[str, str] = {}
    if "graphile-worker" in chosen:
        versions |= _install_graphile(tools / "graphile", progress)
    if "pgqueuer" in chosen:
        versions |= _install_pgqueuer(tools / "pgqueuer", progress)
    return versions


def _install_graphile(graphile: Path, progress: Progress) -> dict[str, str]:
    if not shutil.which("npm"):
        raise RuntimeError("graphile-worker needs Node.js and npm on PATH")
    if not (graphile / "node_modules/graphile-worker").exists():  # --tools: kept from an earlier run
        graphile.mkdir(parents=True, exist_ok=True)
        progress(f"npm install {GRAPHILE_WORKER} into {graphile}")
        npm = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", GRAPHILE_WORKER]
        subprocess.run(npm, cwd=graphile, check=True, stdout=subprocess.DEVNULL)
    gw = json.loads((graphile / "node_modules/graphile-worker/package.json").read_text())["version"]
    node = subprocess.run(["node", "--version"], check=True, capture_output=True, text=True).stdout.strip()
    return {"graphile-worker": gw, "node": node}


def _install_pgqueuer(pgq: Path, progress: Progress) -> dict[str, str]:
    if not (pgq / "venv/bin/pgq").exists():
        progress(f"pip install {PGQUEUER} into {pgq}/venv")
        subprocess.run([sys.executable, "-m", "venv", str(pgq / "venv")], check=True)
        pip = [str(pgq / "venv/bin/pip"), "install", "--quiet", "--disable-pip-version-check", PGQUEUER]
        subprocess.run(pip, check=True, stdout=subprocess.DEVNULL)
    show = subprocess.run(
        [str(pgq / "venv/bin/python"), "-c", "import pgqueuer; print(pgqueuer.__version__)"],
        check=True,
        capture_output=True,
        text=True,
    )
    return {"pgqueuer": show.stdout.strip()}


def server_setting(db_url: str, name: str) -> str:
    """What the server says a setting is (`name` passed pg_setting's check)."""
    with psycopg.connect(db_url) as conn:
        row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
        return str(row[0]) if row else ""


def pg_setting(text: str) -> tuple[str, str]:
    """--pg-setting NAME=VALUE, as argparse reads it."""
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z_]+", name):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE, e.g. wal_compression=pglz")
    return name, value


@contextlib.contextmanager
def shared_servers(
    workdir: Path, tools: Path, progress: Progress, settings: Sequence[tuple[str, str]] = ()
) -> Iterator[Shared]:
    """One embedded Postgres (fsync on, and `settings` on its command line) and one NATS
    (default sync interval) for every system."""
    from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres

    with (
        EmbeddedPostgres(workdir / "pg", fsync=True, settings=dict(settings)) as pg,
        EmbeddedNats(workdir / "nats", sync_always=False) as ns,
    ):
        assert pg.pid is not None and ns.pid is not None
        yield Shared(pg.url, ns.url, pg.pid, ns.pid, workdir, tools, progress)


def _one(system: System, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """One round of a system: its drain on each shape it has, then its lateness (unless
    --seconds 0)."""
    drains: dict[str, dict[str, Any]] = {}
    for shape in (s for s in args.shapes if s in system.shapes):
        progress(f"{system.name}: drain of {args.drain:,} ({shape} table)")
        d = asyncio.run(system.drain(args.drain, shape, args.big))
        drains[shape] = {
            "fires_per_s": drain_rate(d.receipts),
            "cpu_ms_per_1k": cpu_ms_per_1k(d),
            "wal_bytes_per_fire": d.wal_bytes / max(d.fires_in_window, 1),
            "due_pages": d.due_pages,
        }
        progress(
            f"{system.name}: {shape} drain {drains[shape]['fires_per_s']:,.0f}/s, "
            f"{drains[shape]['cpu_ms_per_1k']['total']:.0f} ms CPU per 1,000, "
            f"{drains[shape]['wal_bytes_per_fire']:,.0f} B of WAL per fire"
            + ("" if d.due_pages != d.due_pages else f", due rows on {d.due_pages:,.0f} heap pages")
        )
    late = dict.fromkeys(("p50_ms", "p99_ms", "max_ms"), float("nan"))
    if args.seconds > 0:
        progress(f"{system.name}: lateness at {args.rate:,}/s for {args.seconds:.0f} s")
        late = lateness_ms(asyncio.run(system.lateness(args.rate, args.seconds)).receipts)
        progress(f"{system.name}: lateness p50 {late['p50_ms']:.1f} p99 {late['p99_ms']:.1f} ms")
    return {"drain": drains, "lateness": late}


def run_peers(args: argparse.Namespace, command: str) -> dict[str, Any]:
    def progress(msg: str) -> None:
        print(f"[peers] {msg}", file=sys.stderr, flush=True)

    chosen = args.systems or list(SYSTEMS)
    with tempfile.TemporaryDirectory(prefix="timer-peers-") as tmp:
        # --tools resolved: the peers' installs run with their own directory as the cwd
        workdir, tools = Path(tmp) / "run", args.tools.resolve() if args.tools else Path(tmp) / "tools"
        workdir.mkdir()
        versions = install_peers(tools, chosen, progress)
        calibration = [calibrate(workdir)]
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in chosen}
        with shared_servers(workdir, tools, progress, args.pg_setting) as shared:
            pg_settings = {name: server_setting(shared.admin_url, name) for name, _ in args.pg_setting}
            make: dict[str, Callable[[], System]] = {
                "timer-service": lambda: Ours(shared, args.replicas),
                "timer-service-push": lambda: Ours(shared, args.replicas, push=True),
                "graphile-worker": lambda: GraphileWorker(shared),
                "pgqueuer": lambda: PgQueuer(shared),
                "nats-schedules": lambda: NatsSchedules(shared),
            }
            for i in range(args.runs):  # interleaved: a slow minute of the machine hits everyone
                for name in chosen:
                    progress(f"run {i + 1}/{args.runs}")
                    runs[name].append(_one(make[name](), args, progress))
        calibration.append(calibrate(workdir))
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "calibration": calibration,
        "versions": versions,
        "config": {
            "runs": args.runs,
            "drain_n": args.drain,
            "big": args.big,
            "shapes": args.shapes,
            "rate": args.rate,
            "seconds": args.seconds,
            "replicas": args.replicas,
            "pg_settings": pg_settings,
        },
        "runs": runs,
        "summary": summarize(runs),
    }


def main(argv: list[str] | None = None) -> int:
    about = (__doc__ or "").split("\n\n")[0]
    p = argparse.ArgumentParser(prog=PROG, description=about)
    p.add_argument("--runs", type=int, default=3, help="runs of each workload per system (default 3)")
    p.add_argument("--drain", type=int, default=50_000, help="overdue jobs in the drain (default 50,000)")
    p.add_argument("--rate", type=int, default=500, help="jobs due per second in lateness (default 500)")
    p.add_argument(
        "--seconds", type=float, default=20, help="how long they come due (default 20; 0: no lateness)"
    )
    p.add_argument(
        "--shapes",
        nargs="+",
        choices=SHAPES,
        default=list(SHAPES),
        help="the tables the drain starts from (default all; tools/bench/shapes.py)",
    )
    p.add_argument(
        "--big", type=int, default=FULL_BIG, help=f"future jobs in the big table (default {FULL_BIG:,})"
    )
    p.add_argument("--replicas", type=int, default=WORKERS, help=f"replicas of ours (default {WORKERS})")
    p.add_argument("--systems", nargs="*", choices=SYSTEMS, help="a subset (default all)")
    p.add_argument(
        "--tools", type=Path, help="keep the peers' installs here and reuse them (default: a throwaway dir)"
    )
    p.add_argument(
        "--pg-setting",
        type=pg_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Postgres setting for the run, e.g. wal_compression=pglz (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print every run's figures as JSON")
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    try:
        report = run_peers(args, invocation(PROG, PROG, "bench-peers", given))
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"bench-peers: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
