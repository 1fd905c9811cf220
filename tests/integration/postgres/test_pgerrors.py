"""A failing or hostile database never stops the replicas: errors are classified (pgerrors.py's classify:
retry and report not ready, or stop with one line), and a row that cannot be read or published fails
alone."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import psycopg.errors
import pytest
from psycopg import sql
from pydantic import SecretStr

from tests.helpers import (
    consumer_idle,
    database_encoded,
    iso_in,
    jetstream,
    publish_raw,
    query,
    recorder,
    row,
    running_replica,
    until,
)
from worker.adapters.postgres import db
from worker.adapters.postgres.pgerrors import classify
from worker.config import Settings
from worker.errors import ConfigError, DatabaseError, TransientError
from worker.service import Replica


@pytest.mark.parametrize(
    ("sqlstate", "transient"),
    [
        ("25006", True),  # read_only_sql_transaction: a failover, a disk-full read-only database
        ("25P03", True),  # idle_in_transaction_session_timeout
        ("40001", True),  # serialization_failure
        ("40P01", True),  # deadlock_detected
        ("53100", True),  # disk_full
        ("53300", True),  # too_many_connections
        ("55P03", True),  # lock_not_available
        ("57014", True),  # query_canceled (statement_timeout)
        ("57P01", True),  # admin_shutdown
        ("57P03", True),  # cannot_connect_now (starting up, in recovery)
        ("08006", True),  # connection_failure
        ("58030", True),  # io_error
        ("42P01", False),  # undefined_table: not migrated
        ("42501", False),  # insufficient_privilege
        ("57P04", False),  # database_dropped
        ("22008", False),  # datetime_field_overflow: a bug of ours, not a moment's trouble
        ("XX000", False),  # internal_error
    ],
)
def test_every_database_error_is_classified_by_its_sqlstate(sqlstate: str, transient: bool) -> None:
    error = psycopg.errors.lookup(sqlstate)("the server's message\nDETAIL: more")
    judged = classify(error)
    assert isinstance(judged, TransientError if transient else DatabaseError)
    assert sqlstate in str(judged) and "the server's message" in str(judged)
    assert "\n" not in str(judged)


def test_a_lost_connection_without_a_sqlstate_is_transient() -> None:
    from psycopg_pool import PoolTimeout

    assert isinstance(classify(psycopg.OperationalError("server closed the connection")), TransientError)
    assert isinstance(classify(PoolTimeout("couldn't get a connection after 2.00 sec")), TransientError)
    assert isinstance(classify(psycopg.InterfaceError("the cursor is closed")), DatabaseError)


@contextlib.contextmanager
def read_only(server_url: str) -> Iterator[None]:
    """The whole server refuses writes, as a managed database does on a full disk. The server is
    the test session's: it is writable again on the way out, whatever happened."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET default_transaction_read_only = on")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET default_transaction_read_only")
            conn.execute("SELECT pg_reload_conf()")


def schedule(sc: str, due: str) -> dict[str, str]:
    return {"tenantId": "acme", "serviceCallId": sc, "dueAt": due}


async def test_replicas_ride_out_a_read_only_database_not_ready_and_lose_nothing(
    settings: Settings, db_url: str, pg_server_url: str
) -> None:
    async with (
        running_replica(settings, worker_id="ro-a") as a,
        running_replica(settings, worker_id="ro-b") as b,
        recorder(settings) as rec,
        jetstream(settings) as js,
    ):
        replicas = (a, b)
        before = {f"before-{i}" for i in range(20)}
        for i, sc in enumerate(sorted(before)):  # half fire before, half come due while read-only
            await publish_raw(js, settings, "acme", "schedule", schedule(sc, iso_in(0.5 + i * 0.1, db_url)))
        await until(lambda: len(rec.keys()) >= 5, what="the first timers fired")

        async def all_ready(want: bool) -> bool:
            return all([(await r.ready())[0] is want for r in replicas])

        await until(lambda: all_ready(True), what="both replicas ready")
        during = {f"during-{i}" for i in range(20)}
        with read_only(pg_server_url):
            await until(lambda: all_ready(False), what="both replicas not ready")
            reasons = [(await r.ready())[1] for r in replicas]
            for sc in sorted(during):  # taken from the stream only once Postgres takes writes again
                await publish_raw(js, settings, "acme", "schedule", schedule(sc, iso_in(0.2, db_url)))

            # Their commits fail too: held, offered again, never acknowledged unstored.
            async def redelivered() -> bool:
                info = await js.consumer_info(settings.command_stream, settings.consumer)
                return bool(info.num_redelivered > 0)

            await until(redelivered, timeout=30, what="a refused command offered again")
            assert query(db_url, "SELECT count(*) FROM timers WHERE service_call_id LIKE 'during-%%'") == [
                (0,)
            ]
            assert not any(r.stop.is_set() for r in replicas)
            assert await all_ready(False)
        await until(lambda: all_ready(True), what="both replicas ready again")
        await until(
            lambda: set(rec.keys()) >= {("acme", sc) for sc in before | during}, what="every timer fired"
        )
        assert not any(r.stop.is_set() for r in replicas)
    assert reasons == ["postgres writes failing: ReadOnlySqlTransaction (25006)"] * 2
    assert all(n == 1 for n in rec.keys().values()), "a timer fired twice"
    assert query(db_url, "SELECT state, count(*) FROM timers GROUP BY state") == [("Reached", 40)]


async def test_a_permanent_database_error_stops_the_replica_with_one_line(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    replica = Replica(settings)
    run = asyncio.create_task(replica.run(handle_signals=False))
    await until(lambda: replica.started.is_set(), what="replica start")
    with caplog.at_level(logging.ERROR):
        query(db_url, "DROP TABLE timers")  # as a database restored without the schema
        assert await asyncio.wait_for(run, timeout=30) == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("worker")]
    assert errors, "no line said why the replica stopped"
    assert all(r.exc_info is None for r in errors), "a traceback for a database that says what is wrong"
    # One line per loop that met it (the firing loop's claim, the gauges' read of the index).
    assert all(
        re.fullmatch(
            r'postgres refused \(42P01 UndefinedTable\): relation "timers(_due)?" does not exist',
            r.getMessage(),
        )
        for r in errors
    )


def set_database_time_zone(server_url: str, db_url: str, zone: str) -> None:
    """The zone new sessions on this test's database start in (the database is dropped after it)."""
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    assert isinstance(dbname, str)
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET timezone = {}").format(sql.Identifier(dbname), zone))


def attempts(db_url: str, sc: str) -> int:
    (n,) = query(db_url, "SELECT attempts FROM timers WHERE tenant_id = 'acme' AND service_call_id = %s", sc)[
        0
    ]
    assert isinstance(n, int)
    return n


def insert_scheduled(db_url: str, sc: str, due_at: str) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
        " VALUES ('acme', %s, 'Scheduled', %s::timestamptz, %s::timestamptz)",
        sc,
        due_at,
        due_at,
    )


async def get(js: Any, settings: Settings, sc: str) -> dict[str, Any]:
    reply = await js._nc.request(
        f"{settings.subject_prefix}.acme.timer.get", json.dumps({"serviceCallId": sc}).encode(), timeout=5
    )
    answer: dict[str, Any] = json.loads(reply.data)
    return answer


async def test_rows_no_datetime_holds_fail_alone_west_of_utc(
    settings: Settings, db_url: str, pg_server_url: str
) -> None:
    # The database's own zone is New York: year 1 UTC read there is 0000-12-31 BC.
    set_database_time_zone(pg_server_url, db_url, "America/New_York")
    insert_scheduled(db_url, "year-one", "0001-01-01 00:00:00+00")
    insert_scheduled(db_url, "minus-infinity", "-infinity")
    insert_scheduled(db_url, "infinity", "infinity")  # never due: must not upset the claim either
    async with (
        running_replica(settings, lease_ms=1000, publish_timeout_ms=500) as replica,
        recorder(settings) as rec,
        jetstream(settings) as js,
    ):
        normal = {f"normal-{i}" for i in range(10)}
        for i, sc in enumerate(sorted(normal)):
            await publish_raw(js, settings, "acme", "schedule", schedule(sc, iso_in(0.3 + i * 0.1, db_url)))
        # The same dueAt as a command is refused at the door.
        await publish_raw(js, settings, "acme", "schedule", schedule("sent-year-one", "0001-01-01T00:00:00Z"))
        await until(lambda: set(rec.keys()) == {("acme", sc) for sc in normal}, what="normal timers fired")

        # Each bad row is retried with a back-off that doubles: its third attempt failed and it
        # waits 4 s for the next (a lease is 1 s, a poll 2 s): it does not spin the loop.
        def backing_off(sc: str) -> bool:
            (n, error, wait_s) = query(
                db_url,
                "SELECT attempts, last_error, extract(epoch FROM lease_expires_at - now())"
                " FROM timers WHERE tenant_id = 'acme' AND service_call_id = %s",
                sc,
            )[0]
            return bool(n == 3 and error is not None and wait_s > 3)

        await until(lambda: backing_off("minus-infinity"), timeout=30, what="-infinity backing off")
        minus = await get(js, settings, "minus-infinity")
        await until(lambda: backing_off("year-one"), timeout=30, what="year one backing off")
        year_one = await get(js, settings, "year-one")
        assert not replica.stop.is_set()
        dlq = await js.pull_subscribe(f"{settings.subject_prefix}.acme.timer.dlq", stream=settings.dlq_stream)
        (refused,) = await dlq.fetch(1, timeout=10)
    assert (minus["state"], minus["dueAt"], minus["attempts"]) == ("Scheduled", None, 3)
    assert "dueAt cannot be read" in minus["lastError"]
    assert (year_one["state"], year_one["dueAt"], year_one["attempts"]) == (
        "Scheduled",
        "0001-01-01T00:00:00.000Z",
        3,
    )
    assert "outside 1970-01-01T00:00:00Z..9999-12-31T00:00:00Z" in year_one["lastError"]
    assert attempts(db_url, "infinity") == 0
    assert refused.headers is not None and refused.headers["Timer-Error"] == "bad_due_at"
    assert json.loads(refused.data)["serviceCallId"] == "sent-year-one"
    assert row(db_url, "acme", "sent-year-one") is None


async def test_a_command_behind_a_stuck_occurrence_is_given_up_visibly(
    settings: Settings, db_url: str
) -> None:
    insert_scheduled(db_url, "poison", "-infinity")
    async with (
        running_replica(settings, lease_ms=1000, publish_timeout_ms=500, stuck_after=timedelta(seconds=2)),
        jetstream(settings) as js,
    ):
        await until(lambda: attempts(db_url, "poison") >= 1, what="poison claimed")
        await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": "poison"})
        dlq = await js.pull_subscribe(f"{settings.subject_prefix}.acme.timer.dlq", stream=settings.dlq_stream)
        (given_up,) = await dlq.fetch(1, timeout=20)
        # The command is acknowledged after its DLQ copy is stored, so poll rather than read once.
        await until(lambda: consumer_idle(settings), what="the given-up command acknowledged, not re-queued")
    assert given_up.headers is not None and given_up.headers["Timer-Error"] == "timer_stuck"
    assert "TIMER_STUCK_AFTER" in given_up.headers["Timer-Error-Detail"]
    assert json.loads(given_up.data) == {"tenantId": "acme", "serviceCallId": "poison"}
    assert query(db_url, "SELECT state FROM timers") == [("Scheduled",)]  # the cancel was not applied


async def test_a_row_whose_carried_headers_are_no_object_of_strings_fails_alone(
    settings: Settings, db_url: str
) -> None:
    """carried_headers written by hand: valid JSON, but no object of header strings. Each such row
    is recorded on itself and backs off, as a -infinity row does; the rest fire."""
    bad = {
        "list": "[1, 2]",
        "string": '"traceparent"',
        "number": "42",
        "non-string-value": '{"traceparent": 1}',
        "crlf-value": '{"x-tenant": "a\\r\\nPUB evil 0"}',
        "bad-name": '{"x tenant:": "a"}',
    }
    for sc, carried in bad.items():
        insert_scheduled(db_url, sc, "2026-01-01T00:00:00Z")
        query(db_url, "UPDATE timers SET carried_headers = %s::jsonb WHERE service_call_id = %s", carried, sc)
    async with (
        running_replica(settings, lease_ms=1000, publish_timeout_ms=500) as replica,
        recorder(settings) as rec,
        jetstream(settings) as js,
    ):
        await publish_raw(js, settings, "acme", "schedule", schedule("normal", iso_in(0.2, db_url)))
        await until(lambda: rec.keys()[("acme", "normal")] > 0, what="the normal timer fired")
        for sc in bad:
            await until(lambda sc=sc: attempts(db_url, sc) >= 2, timeout=30, what=f"{sc} retried")
            assert "carried header" in (await get(js, settings, sc))["lastError"]
        assert not replica.stop.is_set()
    assert set(rec.keys()) == {("acme", "normal")}


async def test_a_full_claim_with_unreadable_rows_in_it_counts_as_full(
    settings: Settings, db_url: str
) -> None:
    """A backlog must not pause a poll interval because its batch held a row that cannot fire."""
    insert_scheduled(db_url, "minus-infinity", "-infinity")  # sorts first: in the first claim
    for i in range(10):
        insert_scheduled(db_url, f"overdue-{i}", "2026-01-01T00:00:00Z")
    replica = Replica(settings.model_copy(update={"batch_size": 5}))
    try:
        assert await replica.connect()
        full = await replica.firing.tick()
        assert attempts(db_url, "minus-infinity") == 1, "the unreadable row was not in the claim"
        assert full, "a claim of batch_size rows counted as not full"
    finally:
        await replica.broker.close()
        await replica.pool.close()


@pytest.mark.parametrize("encoding", ["SQL_ASCII", "LATIN1"])
async def test_a_database_not_in_utf8_stops_start_up_with_one_line(
    settings: Settings, pg_server_url: str, encoding: str
) -> None:
    """SQL_ASCII stores bytes unchecked (text came back as bytes, and the first claim killed the
    replica); LATIN1 cannot hold most ids. Neither is usable: refused before anything is written."""
    with database_encoded(pg_server_url, encoding) as url:
        replica = Replica(settings.model_copy(update={"database_url": SecretStr(url)}))
        run = asyncio.create_task(replica.run(handle_signals=False))
        await until(lambda: replica.started.is_set() or run.done(), what="start-up refused or done")
        replica.stop.set()
        with pytest.raises(ConfigError) as refused:
            await asyncio.wait_for(run, timeout=30)
        assert query(url, "SELECT to_regclass('timers') IS NULL") == [(True,)], "it migrated first"
    assert str(refused.value) == (
        f"database {psycopg.conninfo.conninfo_to_dict(url)['dbname']} is encoded {encoding}; timer-service"
        " needs UTF8 (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
    )


async def test_sessions_speak_utf8_whatever_the_database_sets_for_clients(
    settings: Settings, db_url: str, pg_server_url: str
) -> None:
    """A UTF8 database whose sessions default to client_encoding LATIN1 (ALTER DATABASE ... SET):
    every session of the service pins UTF8, so any id is stored, fired and read back."""
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    assert isinstance(dbname, str)
    with psycopg.connect(pg_server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET client_encoding = 'LATIN1'").format(sql.Identifier(dbname))
        )
    async with (
        running_replica(settings) as replica,
        recorder(settings) as rec,
        jetstream(settings) as js,
    ):
        await publish_raw(js, settings, "acme", "schedule", schedule("注文-42", iso_in(0.3, db_url)))
        await until(lambda: rec.keys()[("acme", "注文-42")] == 1, what="注文-42 fired")

        async def reached() -> bool:  # the record commits just after the PubAck: the event can be first
            return (await get(js, settings, "注文-42"))["state"] == "Reached"

        await until(reached, what="注文-42 read back Reached")
        assert not replica.stop.is_set()


async def test_a_row_at_the_largest_attempts_count_fires_without_stopping_the_claim(
    settings: Settings, db_url: str
) -> None:
    """`attempts + 1` on a row at integer's maximum (written by hand, or after years of back-off)
    made the whole claim statement fail with numeric_value_out_of_range, a fatal verdict: one row
    stopped every replica that claimed it. The count saturates instead."""
    insert_scheduled(db_url, "worn-out", "2026-01-01T00:00:00Z")
    query(db_url, "UPDATE timers SET attempts = 2147483647 WHERE service_call_id = 'worn-out'")
    async with running_replica(settings) as replica, recorder(settings) as rec:
        await until(lambda: rec.keys()[("acme", "worn-out")] > 0, what="the worn-out timer fired")
        assert not replica.stop.is_set()


def test_sessions_notice_a_silent_peer_within_seconds_unless_the_url_says_otherwise(db_url: str) -> None:
    """A host lost without closing its connections (a partition): both ends give up after about
    30 s, not the operating system's 15 minutes (db.session_conninfo). The server's end holds a
    claim's row locks while it writes to a vanished replica; this end, a COMMIT sent to a
    vanished primary."""
    with db.connect(db_url) as conn:
        server = conn.execute(
            "SELECT current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_idle')"
        )
        assert server.fetchone() == ("30000", "10")
        client = conn.info.get_parameters()
        assert (client.get("keepalives_idle"), client.get("tcp_user_timeout")) == ("10", "30000")
    with db.connect(
        f"{db_url}{'&' if '?' in db_url else '?'}tcp_user_timeout=5000&keepalives_idle=60"
    ) as conn:
        client = conn.info.get_parameters()
        assert (client.get("keepalives_idle"), client.get("tcp_user_timeout")) == ("60", "5000")
