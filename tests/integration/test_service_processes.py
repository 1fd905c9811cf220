"""The replica (worker/service.py) as real processes, through devkit/harness.py: many timers, a
SIGKILL, a full restart, a SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import nats
import nats.js.errors
import psycopg
import pytest

from tests.helpers import query, recorder, settings_env, until
from worker.config import Settings
from worker.devkit.harness import ReplicaSet

TENANTS = [f"tenant-{i}" for i in range(10)]


@pytest.fixture
def fleet(settings: Settings, tmp_path: Path) -> Iterator[ReplicaSet]:
    with ReplicaSet(settings_env(settings), tmp_path) as replicas:
        yield replicas


@pytest.fixture
async def js(settings: Settings) -> AsyncIterator[object]:
    nc = await nats.connect(settings.nats_url)
    yield nc.jetstream()
    await nc.close()


async def schedule_many(js: object, settings: Settings, keys: list[tuple[str, str]], due: list[str]) -> None:
    """Publish ScheduleTimer commands pipelined, waiting for every PubAck."""
    futures = []
    for (tenant, sc), at in zip(keys, due, strict=True):
        body = json.dumps({"tenantId": tenant, "serviceCallId": sc, "dueAt": at}).encode()
        futures.append(await js.publish_async(f"{settings.subject_prefix}.{tenant}.timer.schedule", body))  # type: ignore[attr-defined]
    await asyncio.gather(*futures)


def spread(n: int, start_s: float, over_s: float, db_url: str) -> list[str]:
    """n due times from start_s to start_s + over_s seconds after the database's now."""
    (now,) = query(db_url, "SELECT now()")[0]
    return [(now + timedelta(seconds=start_s + over_s * i / n)).isoformat() for i in range(n)]


def leased_by(db_url: str, owner: str) -> set[tuple[str, str]]:
    """What a replica holds: its committed leases, and the rows its batches in flight keep locked
    (their lease commits with the record, unseen until then), while it has a session in a
    transaction: every Scheduled row another session cannot lock (a test with one replica)."""
    rows = query(
        db_url,
        "SELECT tenant_id, service_call_id FROM timers WHERE state = 'Scheduled' AND lease_owner = %s",
        owner,
    )
    held = {(t, s) for t, s in rows}
    with psycopg.connect(db_url) as conn:  # one transaction, rolled back: the locks go with it
        (busy,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
            " AND datname = current_database() AND state <> 'idle'",
            (owner,),
        ).fetchone() or (0,)
        if busy:
            keys = "SELECT tenant_id, service_call_id FROM timers WHERE state = 'Scheduled'"
            scheduled = {(t, s) for t, s in conn.execute(keys).fetchall()}
            free = {(t, s) for t, s in conn.execute(keys + " FOR UPDATE SKIP LOCKED").fetchall()}
            held |= scheduled - free
        conn.rollback()
    return held


def connected(db_url: str, names: list[str]) -> bool:
    """Every one of these replicas has a database session: it is past start-up, where its SIGTERM
    handler is set (before that, a SIGTERM ends the process by the signal, -15)."""
    rows = query(
        db_url,
        "SELECT count(DISTINCT application_name) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = ANY(%s)",
        names,
    )
    return bool(rows[0][0] == len(names))


def no_leases_left(db_url: str) -> bool:
    return query(db_url, "SELECT count(*) FROM timers WHERE lease_expires_at IS NOT NULL")[0][0] == 0


async def wait_ready(settings: Settings, js: object) -> None:
    """The shared command consumer exists: a replica has connected and set up the streams."""

    async def consumer_exists() -> bool:
        try:
            await js.consumer_info(settings.command_stream, settings.consumer)  # type: ignore[attr-defined]
            return True
        except nats.js.errors.NotFoundError:
            return False

    await until(consumer_exists, timeout=60, what="streams and consumer created")


async def test_three_replicas_fire_ten_thousand_timers_exactly_once(
    settings: Settings, db_url: str, fleet: ReplicaSet, js: object
) -> None:
    n = 10_000
    keys = [(TENANTS[i % 10], f"sc-{i}") for i in range(n)]
    names = fleet.start(3)
    await wait_ready(settings, js)
    async with recorder(settings) as rec:
        await schedule_many(js, settings, keys, spread(n, 3, 3, db_url))
        await until(lambda: len(rec.keys()) >= n, timeout=120, what="all timers fired")
        await until(lambda: no_leases_left(db_url), what="every lease cleared")
    assert sorted(rec.keys()) == sorted(keys)
    duplicates = sum(c - 1 for c in rec.keys().values())
    assert duplicates == 0
    assert query(db_url, "SELECT count(*) FROM timers WHERE reached_at < due_at") == [(0,)]
    assert fleet.terminate_all() == dict.fromkeys(names, 0)


async def test_sigkill_while_holding_leases_loses_nothing(
    settings: Settings, db_url: str, fleet: ReplicaSet, js: object
) -> None:
    n = 6000
    keys = [(TENANTS[i % 10], f"k-{i}") for i in range(n)]
    (victim,) = fleet.start(1)
    await wait_ready(settings, js)
    async with recorder(settings) as rec:
        await schedule_many(js, settings, keys, spread(n, 1, 6, db_url))
        # Freeze the victim, look at what it holds, and kill it only while it holds leases.
        held: set[tuple[str, str]] = set()
        deadline = time.monotonic() + 30
        while not held and time.monotonic() < deadline:
            fleet.signal(victim, signal.SIGSTOP)
            held = leased_by(db_url, victim)
            if not held:
                fleet.signal(victim, signal.SIGCONT)
                await asyncio.sleep(0.005)
        assert held, "the victim never held a lease"
        fleet.kill(victim)
        fleet.start(2)
        await until(lambda: len(rec.keys()) >= n, timeout=120, what="all timers fired after the kill")
        await until(lambda: no_leases_left(db_url), what="every lease cleared")
    assert sorted(rec.keys()) == sorted(keys)
    # The victim's leases ran out and the survivors fired those timers: none lost, none twice.
    assert held <= set(rec.keys())
    assert all(n == 1 for n in rec.keys().values())


async def test_pending_timers_survive_a_restart_of_every_replica(
    settings: Settings, db_url: str, fleet: ReplicaSet, js: object
) -> None:
    n = 2000
    keys = [(TENANTS[i % 10], f"r-{i}") for i in range(n)]
    names = fleet.start(3)
    await wait_ready(settings, js)
    await schedule_many(js, settings, keys, spread(n, 4, 2, db_url))
    await until(lambda: query(db_url, "SELECT count(*) FROM timers")[0][0] == n, what="all stored")
    # Each one up, not only the one that made the consumer: a SIGTERM during start-up ends a
    # process by the signal (on a loaded machine, one was still importing).
    await until(lambda: connected(db_url, names), what="every replica connected")
    assert fleet.terminate_all() == dict.fromkeys(names, 0)
    async with recorder(settings) as rec:
        fleet.start(3)
        await until(lambda: len(rec.keys()) >= n, timeout=120, what="all fired after restart")
    assert sorted(rec.keys()) == sorted(keys)


async def test_sigterm_drains_and_exits_zero_without_leases(
    settings: Settings, db_url: str, fleet: ReplicaSet, js: object
) -> None:
    n = 20_000
    keys = [(TENANTS[i % 10], f"t-{i}") for i in range(n)]
    (name,) = fleet.start(1)
    await wait_ready(settings, js)
    await schedule_many(js, settings, keys, spread(n, 0, 1, db_url))
    await until(lambda: bool(leased_by(db_url, name)), timeout=30, what="replica busy firing")
    fleet.signal(name, signal.SIGTERM)
    started = time.monotonic()
    code = await asyncio.to_thread(fleet.procs[name].wait, settings.drain_timeout_ms / 1000 + 5)
    assert code == 0
    assert time.monotonic() - started < settings.drain_timeout_ms / 1000 + 5
    assert leased_by(db_url, name) == set()
