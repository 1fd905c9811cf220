"""One benchmark run's world: its own database and streams on shared servers, replicas as processes.

Every run gets a fresh database (migrated) and its own subject prefix and stream names, so runs
never see each other's timers or events, and the servers are started once per `bench` call.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import json
import os
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
import psycopg
from nats.aio.client import Client as NATS

import worker
from worker.adapters.jetstream.broker import Broker
from worker.adapters.postgres.migrations import migrate
from worker.config import Settings
from worker.devkit.harness import ReplicaSet, replica_env_from
from worker.devkit.recorder import EventRecorder
from worker.settings import load_settings

# Bench-only SQL: loading rows fast and reading results. The service's own statements live in
# sql/queries/; none of these run in a replica.
SEED_SQL = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)
SELECT %(tenant)s || (i %% %(tenants)s), %(prefix)s || i, 'Scheduled', d, d
FROM generate_series(0, %(n)s - 1) AS i,
     LATERAL (SELECT now() + make_interval(secs => %(start_s)s + i / %(rate)s::float8)) AS t(d)
"""
COUNT_SCHEDULED_SQL = "SELECT count(*) FROM timers WHERE state = 'Scheduled' AND service_call_id LIKE %s"
XACTS_SQL = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s"


@dataclass(frozen=True)
class StreamState:
    messages: int
    first_ts: float  # epoch seconds
    last_ts: float

    @property
    def span_s(self) -> float:
        return self.last_ts - self.first_ts


def _rfc3339(ts: str) -> float:
    # Nanosecond fractions: Python parses microseconds at most.
    head, _, frac = ts.rstrip("Z").partition(".")
    return datetime.fromisoformat(head + "+00:00").timestamp() + float("0." + (frac or "0"))


def byte_compiled() -> None:
    """Byte-compile the service's modules, as installing the package does (pip writes the .pyc of
    a wheel, so the image's replicas load them). A checkout's editable install has none, and with
    PYTHONDONTWRITEBYTECODE set no run writes them: every replica the bench starts then compiled
    the whole package again, a tenth of a second or more of each start-up a deployed replica never
    spends. Writes only what is missing or stale (__pycache__, ignored by git)."""
    compileall.compile_dir(Path(worker.__file__).parent, quiet=1)


def _tag() -> str:
    return uuid.uuid4().hex[:8]


class Rig:
    """Database, streams, replicas and measurement hooks for one run of one scenario."""

    def __init__(
        self, admin_url: str, nats_url: str, workdir: Path, *, byte_compile: bool = True, **settings: Any
    ) -> None:
        tag = _tag()
        self.byte_compile = byte_compile  # False: replicas compile the package as they start
        self.admin_url = admin_url
        self.nats_url = nats_url
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

    # -- life cycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> Rig:
        if self.byte_compile:
            byte_compiled()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.dbname}"')
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
            jsm = self.nc.jetstream()
            for s in ("command_stream", "event_stream", "dlq_stream"):
                with contextlib.suppress(Exception):  # already gone: nothing to free
                    await jsm.delete_stream(self.names[s])
            await self.nc.close()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)')

    # -- load -----------------------------------------------------------------------------------
    async def seed(
        self, n: int, *, start_s: float, rate: float, key_prefix: str, tenant: str = "t", tenants: int = 10
    ) -> None:
        """Insert n Scheduled timers straight into the table, due from now()+start_s at `rate` per second.

        This stands for timers scheduled long ago; VACUUM ANALYZE leaves the table as autovacuum
        would have, so claims run against realistic statistics and visibility.
        """
        params = {
            "n": n,
            "start_s": start_s,
            "rate": rate,
            "prefix": key_prefix,
            "tenant": tenant,
            "tenants": tenants,
        }
        async with await psycopg.AsyncConnection.connect(self.db_url, autocommit=True) as conn:
            await conn.execute(SEED_SQL, params)
            await conn.execute("VACUUM ANALYZE timers")

    async def publish_commands(self, bodies: Iterable[tuple[str, bytes]]) -> int:
        """Publish (subject, body) commands into the command stream, pipelined; the count."""
        js = self.nc_.jetstream(publish_async_max_pending=4000)
        futures = [await js.publish_async(subject, body) for subject, body in bodies]
        await asyncio.gather(*futures)
        return len(futures)

    # -- replicas -------------------------------------------------------------------------------
    def start_replicas(self, n: int) -> list[str]:
        return self.fleet.start(n)

    async def wait_replicas_up(self, names: list[str], timeout: float = 60) -> None:
        """Until every replica holds a database connection: started, migrated, pool open."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cur = await self.db_.execute(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                "WHERE datname = %s AND application_name = ANY(%s)",
                (self.dbname, names),
            )
            row = await cur.fetchone()
            if row and row[0] == len(names):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"replicas did not come up; logs in {self.workdir}")

    def rss_mb(self) -> dict[str, float]:
        """Resident memory of each live replica, from /proc."""
        out: dict[str, float] = {}
        for name in self.fleet.alive():
            try:
                status = Path(f"/proc/{self.fleet.procs[name].pid}/status").read_text()
            except OSError:
                continue
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    out[name] = int(line.split()[1]) / 1024
        return out

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the live replicas used so far: steadier than rates."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for name in self.fleet.alive():
            try:
                fields = (
                    Path(f"/proc/{self.fleet.procs[name].pid}/stat").read_text().rsplit(")", 1)[1].split()
                )
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick
        return total

    # -- observation ----------------------------------------------------------------------------
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
        cur = await self.db_.execute(sql, params or None)
        row = await cur.fetchone()
        return row[0] if row else None

    async def transactions(self) -> int:
        """Transactions committed in this run's database so far (one per autocommit statement)."""
        async with await psycopg.AsyncConnection.connect(self.admin_url, autocommit=True) as conn:
            await conn.execute("SELECT pg_stat_clear_snapshot()")
            cur = await conn.execute(XACTS_SQL, (self.dbname,))
            row = await cur.fetchone()
            return int(row[0]) if row else 0

    @property
    def nc_(self) -> NATS:
        assert self.nc is not None, "use the rig inside `async with`"
        return self.nc

    @property
    def db_(self) -> psycopg.AsyncConnection[Any]:
        assert self.db is not None, "use the rig inside `async with`"
        return self.db


def machine() -> dict[str, Any]:
    """What the results were measured on."""
    info: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory_gb"] = round(int(mem) / 1024 / 1024, 1)
    except OSError:
        pass
    return info
