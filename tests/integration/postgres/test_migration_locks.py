"""A migration that must wait for its lock does not hold up the fleet (docs/UPGRADING.md).

A long transaction that has read `timers` (a pg_dump, a report) holds a lock an `ALTER TABLE`
needs; the ALTER waits in the lock queue, and every claim, record and intake write that comes after
it queues behind it. The runner therefore waits a short `lock_timeout` per attempt, rolls back
and retries with back-off, so the queue is never held for longer than that.

Replicas migrating an empty database together take turns on the migration lock without a deadlock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from tests.helpers import database_encoded, jetstream, query, recorder, running_replica, until
from worker.adapters.postgres import migrations
from worker.config import Settings

ROOT = Path(__file__).parents[3]
NEXT_RELEASE = ROOT / "tests" / "fixtures" / "next_release"
TENANT = "acme"
MIGRATORS = 6  # replicas and `timer-service migrate` Jobs starting at once
LATE_RATIO = 3.0  # timers beside a blocked migration against the same run's calm ones
log = logging.getLogger(__name__)


def release_with(tmp_path: Path, *stand_ins: str) -> Path:
    """The shipped migrations plus the named stand-ins for the next release's."""
    for path in [*(ROOT / "sql" / "migrations").glob("*.sql"), *(NEXT_RELEASE / n for n in stand_ins)]:
        (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"))
    return tmp_path


@pytest.fixture
def long_reader(db_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A transaction that has read `timers` and stays open (its ACCESS SHARE lock and its snapshot
    with it), as a pg_dump's does, until the test rolls it back."""
    with psycopg.connect(db_url) as conn:
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")  # as pg_dump's
        conn.execute("SELECT count(*) FROM timers")
        yield conn
        conn.rollback()


def waiting_for(db_url: str, mode: str) -> bool:
    """Some session is queued (not granted) for `mode` on `timers`."""
    found = query(
        db_url,
        "SELECT count(*) FROM pg_locks WHERE relation = 'timers'::regclass AND NOT granted AND mode = %s",
        mode,
    )
    return bool(found[0][0])


async def test_an_add_column_blocked_by_a_long_reader_keeps_timers_on_time(
    settings: Settings,
    db_url: str,
    tmp_path: Path,
    long_reader: psycopg.Connection[tuple[object, ...]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While the ALTER cannot have its lock, timers due meanwhile (stored before it and sent
    during it) fire about on time; once the reader ends, a retry applies the migration.
    (Before: the file's own `lock_timeout = 5s` held every claim and intake write for 5 s, and
    the migration then failed.)"""
    release = release_with(tmp_path, "0098_note.sql")
    caplog.set_level(logging.INFO, logger="worker.adapters.postgres.migrations")
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:

        async def schedule(prefix: str, n: int, start_s: float, over_s: float) -> None:
            (now,) = query(db_url, "SELECT now()")[0]
            for i in range(n):
                due = (now + timedelta(seconds=start_s + over_s * i / n)).isoformat()
                body = {"tenantId": TENANT, "serviceCallId": f"{prefix}-{i}", "dueAt": due}
                await js.publish(
                    f"{settings.subject_prefix}.{TENANT}.timer.schedule", json.dumps(body).encode()
                )

        # The baseline: how late timers fire here with no migration at all (a loaded machine
        # makes both late alike); the bound is a multiple of it plus the quiet machine's second.
        await schedule("calm", 20, 1.0, 1.0)
        await until(lambda: len(rec.records) == 20, timeout=60, what="20 calm timers fired")
        baseline = max(f.reached_at - f.due_at for f in rec.records)
        await schedule("stored", 20, 3.0, 4.0)  # stored before the migration starts
        await until(lambda: query(db_url, "SELECT count(*) FROM timers")[0][0] == 40, what="20 timers stored")
        migration = asyncio.create_task(asyncio.to_thread(migrations.migrate, db_url, release))
        await until(lambda: waiting_for(db_url, "AccessExclusiveLock"), what="the ALTER waiting for its lock")
        await schedule("sent", 20, 1.0, 4.0)  # intake while the migration is blocked
        await until(lambda: len(rec.records) == 60, timeout=60, what="40 timers fired")
        blocked_throughout = not migration.done()
        lateness = sorted(
            f.reached_at - f.due_at for f in rec.records if not f.service_call_id.startswith("calm")
        )
        late = [x for x in lateness if x > 0.25]
        bound = LATE_RATIO * baseline + 1.0
        log.warning(
            "lateness while blocked: max %.3f s (calm %.3f s), %d of 40 later than 250 ms",
            lateness[-1],
            baseline,
            len(late),
        )
        assert lateness[-1] < bound, (
            f"max lateness {lateness[-1]:.3f}s (bound {bound:.3f}s), {len(late)} of 40 later than 250 ms"
        )
        assert blocked_throughout, "the migration was not blocked while the timers fired: nothing measured"
        long_reader.rollback()  # the dump ends
        applied = await asyncio.wait_for(migration, timeout=60)

    assert any(getattr(r, "action", None) == "migration_lock_retry" for r in caplog.records)
    assert applied == [98]
    assert query(db_url, "SELECT count(*) FROM timer_schema_version WHERE version = 98") == [(1,)]


def test_a_migration_blocked_past_its_budget_names_the_blocker(
    db_url: str, tmp_path: Path, long_reader: psycopg.Connection[tuple[object, ...]]
) -> None:
    """After the retry budget the runner fails with one line naming the session in the way,
    and leaves nothing applied."""
    release = release_with(tmp_path, "0098_note.sql")
    with pytest.raises(migrations.MigrationBlocked) as failed:
        migrations.migrate(db_url, release, budget_s=1.0)
    message = str(failed.value)
    assert "\n" not in message
    assert f"pid {long_reader.info.backend_pid}" in message
    assert "SELECT count(*) FROM timers" in message
    assert query(db_url, "SELECT count(*) FROM timer_schema_version WHERE version = 98") == [(0,)]


async def test_a_concurrent_index_build_waits_for_a_long_reader_without_queueing_writes(
    db_url: str, tmp_path: Path, long_reader: psycopg.Connection[tuple[object, ...]]
) -> None:
    """CREATE INDEX CONCURRENTLY waits for older transactions but takes no lock a write waits
    for: the runner lets it wait as long as the reader lasts (a short lock_timeout would cancel
    it on every attempt) while writes go on. (Before: the file's `lock_timeout = 5s` cancelled
    the build behind a reader that outlasted it.)"""
    release = release_with(tmp_path, "0099_tenant_due.sql")
    migration = asyncio.create_task(asyncio.to_thread(migrations.migrate, db_url, release))
    waited = lambda: migration.done() or building_for(db_url, seconds=6)  # noqa: E731
    await until(waited, timeout=60, what="the build waiting 6 s for the reader")
    assert not migration.done(), f"the build gave up behind the reader: {migration.exception()!r}"
    with psycopg.connect(db_url, autocommit=True) as writer:
        writer.execute("SET lock_timeout = '2s'")  # a write queued behind the build fails, not hangs
        writer.execute(
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at)"
            " VALUES ('t', 'w', 'Scheduled', now())"
        )
    long_reader.rollback()
    assert await asyncio.wait_for(migration, timeout=60) == [99]
    valid = query(db_url, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'timers_tenant_due'::regclass")
    assert valid == [(True,)]


def building_for(db_url: str, seconds: float) -> bool:
    """The index build has been waiting for a lock (the reader's transaction) for `seconds`."""
    found = query(
        db_url,
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'CREATE INDEX CONCURRENTLY%%'"
        " AND wait_event_type = 'Lock' AND now() - query_start > make_interval(secs => %s)",
        seconds,
    )
    return bool(found[0][0])


@pytest.mark.parametrize("round_", range(3))
def test_migrators_starting_together_on_an_empty_database_apply_each_migration_once(
    pg_server_url: str, caplog: pytest.LogCaptureFixture, round_: int
) -> None:
    """Replicas (and `timer-service migrate`) starting together on an empty database: one applies
    every migration, the others wait for it and find nothing left; none fails, none logs a warning.
    A migrator queued on the lock would hold a snapshot, which the holder's CREATE INDEX
    CONCURRENTLY waits for: each would wait for the other."""
    caplog.set_level(logging.WARNING, logger="worker")
    with database_encoded(pg_server_url, "UTF8") as url:
        start = threading.Barrier(MIGRATORS)

        def migrator() -> list[int]:
            start.wait(timeout=60)
            return migrations.migrate(url)

        with ThreadPoolExecutor(MIGRATORS) as pool:
            runs = [pool.submit(migrator) for _ in range(MIGRATORS)]
            failed = [repr(e) for run in runs if (e := run.exception(timeout=300))]
        assert failed == []
        applied = sorted(v for run in runs for v in run.result())
        assert applied == [version for version, _, _ in migrations.available()]
        assert migrations.status(url)[1] == []
        assert query(url, "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid") == []
    assert [r.getMessage() for r in caplog.records] == []
