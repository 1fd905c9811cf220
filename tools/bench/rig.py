"""One run's world: a fresh database and streams on shared servers, replicas as processes, and the
measures the scenarios share (what a run is given, its CPU from /proc, lateness)."""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import psycopg
from nats.aio.client import Client as NATS

import tools
import worker
from worker.adapters.jetstream.broker import Broker
from worker.adapters.postgres.migrations import migrate
from worker.config import Settings
from worker.devkit.harness import ReplicaSet, percentile, replica_env_from
from worker.devkit.recorder import EventRecorder, Firing
from worker.settings import load_settings

Progress = Callable[[str], None]
Metrics = dict[str, float]
ROOT = Path(tools.__file__).resolve().parent.parent  # the checkout: a child imports tools from it
TICK = os.sysconf("SC_CLK_TCK")

# Bench-only SQL: loading rows fast and reading results; none of it runs in a replica.
SEED_SQL = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)
SELECT %(tenant)s || (i %% %(tenants)s), %(prefix)s || i, 'Scheduled', d, d
FROM generate_series(0, %(n)s - 1) AS i,
     LATERAL (SELECT now() + make_interval(secs => %(start_s)s + i / %(rate)s::float8)) AS t(d)
"""
COUNT_SCHEDULED_SQL = "SELECT count(*) FROM timers WHERE state = 'Scheduled' AND service_call_id LIKE %s"
XACTS_SQL = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s"
BACKEND_PID_SQL = "SELECT pg_backend_pid()"
WAL_LSN_SQL = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"  # WAL written so far, bytes


@dataclass(frozen=True)
class StreamState:
    messages: int
    first_ts: float  # epoch seconds
    last_ts: float

    @property
    def span_s(self) -> float:
        return self.last_ts - self.first_ts


def _rfc3339(ts: str) -> float:
    head, _, frac = ts.rstrip("Z").partition(".")  # nanoseconds: Python parses microseconds at most
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


class Rig:
    """Database, streams, replicas and measurement hooks for one run of one scenario."""

    def __init__(
        self, admin_url: str, nats_url: str, workdir: Path, *, byte_compile: bool = True, **settings: Any
    ) -> None:
        tag = uuid.uuid4().hex[:8]
        self.byte_compile = byte_compile  # False: replicas compile the package as they start
        self.admin_url, self.nats_url = admin_url, nats_url
        self.dbname = f"bench_{tag}"
        self.db_url = admin_url.rsplit("/", 1)[0] + f"/{self.dbname}"
        self.names = {
            "subject_prefix": f"b{tag}",
            "command_stream": f"B{tag}_COMMANDS",
            "event_stream": f"B{tag}_EVENTS",
            "dlq_stream": f"B{tag}_DLQ",
            "consumer": f"bench-{tag}",
            "log_format": "json",
            "log_level": "WARNING",
            **settings,
        }
        self.settings: Settings = load_settings(
            database_url=self.db_url, nats_url=nats_url, worker_id="bench", **self.names
        )
        self.workdir = workdir / tag
        self.workdir.mkdir(parents=True)
        self.fleet = ReplicaSet(replica_env_from(self.db_url, nats_url, **self.names), self.workdir)
        self.nc: NATS | None = None
        self.db: psycopg.AsyncConnection[Any] | None = None

    async def __aenter__(self) -> Rig:
        if self.byte_compile:  # as installing a wheel does: replicas then start as a deployed one
            compileall.compile_dir(Path(worker.__file__).parent, quiet=1)
        admin(self.admin_url, f'CREATE DATABASE "{self.dbname}"')
        await asyncio.to_thread(migrate, self.db_url)
        self.db = await psycopg.AsyncConnection.connect(self.db_url, autocommit=True)
        self.nc = await nats.connect(self.nats_url, max_reconnect_attempts=-1)
        broker = Broker(self.settings)  # the streams, so load can be published before any replica runs
        await broker.connect()
        try:
            await broker.ensure_streams()
            await broker.batches_measured()  # as a running service leaves it, for the producers
        finally:
            await broker.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.fleet.terminate_all)
        if self.db is not None:
            await self.db.close()
        if self.nc is not None:
            for s in ("command_stream", "event_stream", "dlq_stream"):
                with contextlib.suppress(Exception):  # already gone: nothing to free
                    await self.nc.jetstream().delete_stream(self.names[s])
            await self.nc.close()
        admin(self.admin_url, f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')

    async def seed(
        self, n: int, *, start_s: float, rate: float, key_prefix: str, tenant: str = "t", tenants: int = 10
    ) -> None:
        """n Scheduled timers straight into the table, due from now()+start_s at `rate` a second,
        then VACUUM ANALYZE, as autovacuum would leave timers scheduled long ago."""
        params = {"n": n, "start_s": start_s, "rate": rate, "prefix": key_prefix}
        async with await psycopg.AsyncConnection.connect(self.db_url, autocommit=True) as conn:
            await conn.execute(SEED_SQL, params | {"tenant": tenant, "tenants": tenants})
            await conn.execute("VACUUM ANALYZE timers")

    async def publish_commands(self, bodies: Iterable[tuple[str, bytes]]) -> int:
        """Publish (subject, body) commands into the command stream, pipelined; the count."""
        js = self.nc_.jetstream(publish_async_max_pending=4000)
        futures = [await js.publish_async(subject, body) for subject, body in bodies]
        await asyncio.gather(*futures)
        return len(futures)

    def start_replicas(self, n: int) -> list[str]:
        return self.fleet.start(n)

    async def wait_replicas_up(self, names: list[str], timeout: float = 60) -> None:
        """Until every replica holds a database connection: started, migrated, pool open."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            up = await self.scalar(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name = ANY(%s)",
                self.dbname,
                names,
            )
            if up == len(names):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"replicas did not come up; logs in {self.workdir}")

    def pids(self) -> list[int]:
        return [self.fleet.procs[name].pid for name in self.fleet.alive()]

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of each live replica, from /proc."""
        out: dict[str, float] = {}
        for name in self.fleet.alive():
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{self.fleet.procs[name].pid}/status").read_text()
                rss = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
                out[name] = int(rss.split()[1]) / 1024
        return out

    def cpu_s(self) -> float:
        """CPU seconds the live replicas used so far: steadier than rates."""
        return tree_cpu_s(self.pids())

    def recorder(self, tenant: str = "*", durable: str | None = None) -> EventRecorder:
        """Every event as stored (an ordered consumer); with `durable`, as a user's consumer gets them."""
        return EventRecorder(
            self.nc_, self.names["subject_prefix"], self.names["event_stream"], tenant, durable
        )

    async def events_state(self) -> StreamState:
        """Messages in the event stream and the times of the first and last (nats-py drops those)."""
        reply = await self.nc_.request(f"$JS.API.STREAM.INFO.{self.names['event_stream']}", b"", timeout=5)
        state = json.loads(reply.data)["state"]
        return StreamState(state["messages"], _rfc3339(state["first_ts"]), _rfc3339(state["last_ts"]))

    async def scalar(self, sql: str, *params: Any) -> Any:
        row = await (await self.db_.execute(sql, params or None)).fetchone()
        return row[0] if row else None

    async def transactions(self) -> int:
        """Transactions committed in this run's database so far (one per autocommit statement)."""
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as conn:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            row = await (await conn.execute(XACTS_SQL, (self.dbname,))).fetchone()
            return int(row[0]) if row else 0

    @property
    def nc_(self) -> NATS:
        assert self.nc is not None, "use the rig inside `async with`"
        return self.nc

    @property
    def db_(self) -> psycopg.AsyncConnection[Any]:
        assert self.db is not None, "use the rig inside `async with`"
        return self.db


def admin(url: str, *statements: str) -> Any:
    """Run statements on their own autocommit connection; the first column of the last's row."""
    with psycopg.connect(url, autocommit=True) as conn:
        for s in statements:
            cur = conn.execute(s)
        row = cur.fetchone() if cur.description else None
        return row[0] if row else None


@dataclass(frozen=True)
class Context:
    """What every scenario is given: the servers, its sizes and where to say how it goes."""

    admin_url: str
    nats_url: str
    workdir: Path
    replicas: int
    scale: float
    progress: Progress
    vacuum_cost_delay_ms: float | None = None  # the soak's --vacuum-cost-delay-ms
    soak_rate: int | None = None  # the soak's --soak-rate

    def n(self, full: int, floor: int = 1000) -> int:
        return max(floor, int(full * self.scale))

    def seconds(self, full: float, floor: float = 10) -> float:
        return max(floor, full * self.scale)

    def rig(self, **settings: Any) -> Rig:
        return Rig(self.admin_url, self.nats_url, self.workdir, **settings)


async def python_child(call: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """`call`, Python importing tools/bench, in a process of its own (stdout a pipe): what the
    bench's interpreter would stall and so falsify the timings of."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-c", call, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE
    )


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


ProcTable = tuple[dict[int, float], dict[int, list[int]]]  # CPU seconds by pid; children by pid


def proc_table() -> ProcTable:
    """Every process's CPU seconds (its own and its reaped children's) and children, from /proc."""
    cpu: dict[int, float] = {}
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = _stat(int(entry))
                cpu[int(entry)] = sum(int(x) for x in fields[11:15]) / TICK  # u, s, cu, cs time
                children.setdefault(int(fields[1]), []).append(int(entry))
    return cpu, children


def tree_cpu_s(roots: list[int], table: ProcTable | None = None) -> float:
    """CPU seconds of these processes and all their descendants, live or already reaped."""
    cpu, children = table or proc_table()
    total, todo, seen = 0.0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid not in seen and pid in cpu:
            seen.add(pid)
            total += cpu[pid]
            todo.extend(children.get(pid, []))
    return total


def postgres_cpu_s(backend_pid: int) -> float:
    """CPU seconds of the whole Postgres server whose backend this is; NaN when not on this machine."""
    try:
        return tree_cpu_s([int(_stat(backend_pid)[1])])  # the backend's parent: the postmaster
    except (OSError, IndexError):
        return float("nan")


def lateness_ms(events: list[Firing], prefix: str) -> Metrics:
    """Percentiles of receive time minus dueAt of each first receipt of a key with this prefix;
    reachedAt (the replica's database-clock publish time) splits it into the replica's part and
    the hop (the publish, the delivery and the replica's clock estimate, never ahead)."""
    first: dict[str, Firing] = {}
    for e in events:
        if e.service_call_id.startswith(prefix):
            first.setdefault(e.service_call_id, e)
    late = [(e.received_at - e.due_at) * 1000 for e in first.values()]
    reached = [(e.reached_at - e.due_at) * 1000 for e in first.values()]
    hop = [(e.received_at - e.reached_at) * 1000 for e in first.values()]
    return {
        "reached_p50_ms": percentile(reached, 50),
        "reached_p99_ms": percentile(reached, 99),
        "hop_p50_ms": percentile(hop, 50),
        "hop_p99_ms": percentile(hop, 99),
        "lateness_p50_ms": percentile(late, 50),
        "lateness_p99_ms": percentile(late, 99),
        "lateness_max_ms": max(late, default=float("nan")),
        "early": sum(1 for x in late if x < 0),
    }


async def until_fired(rig: Rig, n: int, timeout: float, progress: Progress, rss: list[float]) -> None:
    """Poll the event stream until it holds n events; sample replica memory on the way."""
    deadline, shown = time.monotonic() + timeout, 0.0
    while (state := await rig.events_state()).messages < n:
        rss.extend(rig.rss_mb().values())
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {state.messages} of {n} fired in {timeout:.0f}s; logs in {rig.workdir}")
        if time.monotonic() - shown > 2:
            progress(f"fired {state.messages:,}/{n:,}")
            shown = time.monotonic()
        await asyncio.sleep(0.25)
    rss.extend(rig.rss_mb().values())


async def until_marked(rig: Rig, key_prefix: str, timeout: float = 60) -> int:
    """Wait until no timer with this key prefix is left Scheduled; the number still left."""
    deadline, left = time.monotonic() + timeout, -1
    while time.monotonic() < deadline:
        left = int(await rig.scalar(COUNT_SCHEDULED_SQL, key_prefix + "%"))
        if left == 0:
            break
        await asyncio.sleep(0.25)
    return left


def schedule_command(prefix: str, tenant: str, key: str, due: datetime) -> tuple[str, bytes]:
    payload = {"tenantId": tenant, "serviceCallId": key, "dueAt": due.isoformat().replace("+00:00", "Z")}
    body = {
        "id": str(uuid.uuid4()),
        "type": "ScheduleTimer",
        "tenantId": tenant,
        "timestampMs": time.time_ns() // 1_000_000,
        "payload": payload,
    }
    return f"{prefix}.{tenant}.timer.schedule", json.dumps(body).encode()
