"""Shared test tools: an in-process replica, raw command publishing, polling with deadlines, the
settings as a child process's environment."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import psycopg
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from prometheus_client import REGISTRY
from psycopg import sql

from worker.adapters.postgres import db
from worker.config import Settings
from worker.contract import MessageIds
from worker.devkit.polling import until_async
from worker.devkit.recorder import EventRecorder
from worker.service import Replica

# The devkit's poll-until, under the name the tests have always called it by.
until = until_async


async def while_progressing(
    count: Callable[[], int | Awaitable[int]],
    target: int,
    stall_s: float = 60.0,
    what: str = "progress",
    interval: float = 0.1,
) -> int:
    """Poll `count` until it reaches `target`; TimeoutError once it has not moved for `stall_s`.

    For work of a fixed size (a backlog to drain, a flood's CPU to spend): a loaded machine takes
    longer to finish it, not longer between steps, so a wait on progress holds where a deadline
    for the whole fails, and a drain that stopped still fails after `stall_s`."""
    last, moved = -1, time.monotonic()
    while True:
        value = count()
        now = await value if inspect.isawaitable(value) else value
        if now >= target:
            return now
        if now != last:
            last, moved = now, time.monotonic()
        elif time.monotonic() - moved > stall_s:
            raise TimeoutError(f"{what}: stuck at {now} of {target} for {stall_s:g}s")
        await asyncio.sleep(interval)


@contextlib.asynccontextmanager
async def running_replica(settings: Settings, **overrides: Any) -> AsyncIterator[Replica]:
    """A replica in this event loop; stopped (soft) and awaited on exit."""
    replica = Replica(settings.model_copy(update=overrides) if overrides else settings)
    task = asyncio.create_task(replica.run(handle_signals=False))
    await until(lambda: replica.started.is_set() or task.done(), what="replica start")
    if task.done():
        task.result()
    try:
        yield replica
    finally:
        replica.stop.set()
        assert await asyncio.wait_for(task, timeout=30) == 0


@contextlib.asynccontextmanager
async def recorder(settings: Settings) -> AsyncIterator[EventRecorder]:
    rec = EventRecorder(settings.nats_url, settings.subject_prefix, settings.event_stream)
    await rec.start()
    try:
        yield rec
    finally:
        await rec.stop()


@contextlib.asynccontextmanager
async def jetstream(settings: Settings) -> AsyncIterator[Any]:
    nc = await nats.connect(settings.nats_url)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


async def consumer_idle(settings: Settings) -> bool:
    """Every command in the stream handled: none pending, none awaiting an acknowledgement."""
    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().consumer_info(settings.command_stream, settings.consumer)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0)
    finally:
        await nc.close()


async def publish_raw(js: Any, settings: Settings, tenant: str, kind: str, body: Any) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    await js.publish(f"{settings.subject_prefix}.{tenant}.timer.{kind}", data)


def query(db_url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(sql, params)  # type: ignore[arg-type]
        return cur.fetchall() if cur.description else []


def insert_due(db_url: str, key: str, tenant: str = "acme") -> None:
    """A one-shot timer of `tenant` that came due a second ago (the database's clock), stored as
    intake would leave it, without a command."""
    due = iso_in(-1, db_url)
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
        " VALUES (%s, %s, 'Scheduled', %s, %s)",
        tenant,
        key,
        due,
        due,
    )


def commands_applied(kind: str, *outcomes: str) -> float:
    """Commands of this kind intake took with any of these outcomes (timer_commands_applied_total)."""
    return sum(
        REGISTRY.get_sample_value("timer_commands_applied_total", {"kind": kind, "outcome": o}) or 0.0
        for o in outcomes
    )


# Downtime is a timer left unclaimed for TIMER_DOWNTIME_AFTER (a minute by default): these
# settings make it 1.3 s, so a test of downtime needs only a few seconds of it.
QUICK_DOWNTIME: dict[str, Any] = {
    "lease_ms": 1000,
    "poll_interval_ms": 300,
    "publish_timeout_ms": 500,
    "downtime_after": timedelta(milliseconds=1300),
}


def epoch(iso: str) -> float:
    """An RFC 3339 time (as events and commands write it) in epoch seconds."""
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def message_ids(db_url: str) -> MessageIds:
    """The Nats-Msg-Ids of this database's fleet (its fleet secret, migration 0005)."""
    return MessageIds(db.fleet_secret(db_url))


def row(db_url: str, tenant: str, service_call_id: str) -> dict[str, Any] | None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        cur.execute(
            "SELECT * FROM timers WHERE tenant_id = %s AND service_call_id = %s", (tenant, service_call_id)
        )
        return cur.fetchone()


def iso_in(seconds: float, db_url: str | None = None) -> str:
    """An RFC 3339 time `seconds` from now (the database's now when db_url is given)."""
    from datetime import UTC, datetime, timedelta

    if db_url:
        (now,) = query(db_url, "SELECT now()")[0]
    else:
        now = datetime.now(UTC)
    return (now + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


async def http_get(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    """(status, body) of one GET to a replica's HTTP port."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def settings_env(settings: Settings) -> dict[str, str]:
    """TIMER_* variables that reproduce these settings in a child process (secrets included)."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        if hasattr(value, "total_seconds"):
            value = f"{value.total_seconds()}s"
        if isinstance(value, bool):
            value = "true" if value else "false"
        env[f"TIMER_{name.upper()}"] = str(value)
    env.pop("TIMER_WORKER_ID", None)
    return env


async def due_events(js: Any, settings: Settings, count: int) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """The first `count` DueTimeReached events of tenant acme: (body, headers), in stream order."""
    sub = await js.pull_subscribe(f"{settings.subject_prefix}.acme.timer.due", stream=settings.event_stream)
    got: list[Any] = []

    async def fetched() -> bool:
        with contextlib.suppress(TimeoutError):
            got.extend(await sub.fetch(count - len(got), timeout=0.5))
        return len(got) >= count

    await until(fetched, what=f"{count} DueTimeReached events")
    return [(json.loads(m.data), dict(m.headers or {})) for m in got]


@contextlib.contextmanager
def database_encoded(server_url: str, encoding: str) -> Iterator[str]:
    """A database of this encoding (what initdb under the C locale gives is SQL_ASCII); dropped after."""
    name = f"enc_{encoding.lower()}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} ENCODING {} LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0").format(
                sql.Identifier(name), sql.Literal(encoding)
            )
        )
    try:
        yield psycopg.conninfo.make_conninfo(server_url, dbname=name)
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def tool_venv(venv: Path, requirements: Path) -> Path:
    """The Python of `venv`, a venv of test tools kept apart from the service's (.venv-helm,
    .venv-patroni), made or refreshed here from `requirements` by this interpreter. One builder at
    a time when several test runs start together; the others wait, then reuse it."""
    python = venv / "bin" / "python"
    stamp = venv / ".installed"  # holds the requirements it was built from
    wanted = requirements.read_text()
    tag = hashlib.sha256(str(venv).encode()).hexdigest()[:12]
    with open(Path(tempfile.gettempdir()) / f"{venv.name.lstrip('.')}-{tag}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not python.exists() or not stamp.exists() or stamp.read_text() != wanted:
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, "-r", str(requirements)], check=True)
            stamp.write_text(wanted)
    return python


def property_settings(examples: int) -> hypothesis_settings:
    """The property tests' settings: a fixed seed and `examples` examples in `make test`,
    TIMER_CHAOS_SCALE times as many in `make chaos-soak`; no deadline (real servers answer)."""
    return hypothesis_settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=round(examples * float(os.environ.get("TIMER_CHAOS_SCALE", "1"))),
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
        ],
    )
