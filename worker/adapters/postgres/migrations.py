"""Versioned schema migrations from sql/migrations, safe when N replicas run them at once.

Each migration runs in a transaction of its own with its version row, so a failure leaves the
ones before it applied. A file whose first line is `-- migration: no-transaction` runs statement
by statement outside any transaction (`CREATE INDEX CONCURRENTLY` cannot run inside one): every
statement in it ends a line with `;` and can be run again after a failure half-way
(tests/integration/postgres/test_migrations.py holds every file to these rules and the README's
upgrade rules).

A migration that must wait for a lock (an ALTER TABLE behind a long transaction that has read the
table, a pg_dump) would hold every claim, mark and intake write queued behind it for as long as
it waits. So the runner, not the file, bounds each attempt's wait to LOCK_TIMEOUT_MS, rolls back
and tries again with back-off and jitter for up to `budget_s`: the fleet is held up by at most
LOCK_TIMEOUT_MS at a time. A file never sets lock_timeout itself (it would replace the runner's).
CONCURRENTLY statements are the exception: they wait for older transactions without taking a
lock that a write waits for, and a short timeout would only cancel them on every attempt.
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from importlib.resources.abc import Traversable

import psycopg
from psycopg import sql
from psycopg.errors import LockNotAvailable
from psycopg.rows import TupleRow
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    retry_if_result,
    stop_after_delay,
    wait_fixed,
    wait_random_exponential,
)

from worker.adapters.postgres import db

log = logging.getLogger(__name__)

# Any constant works; it only has to be the same for every replica.
_MIGRATION_LOCK = 0x7115_E4
NO_TRANSACTION = "-- migration: no-transaction"
# The longest one attempt waits in a lock queue, so the longest a claim or a write waits behind it.
LOCK_TIMEOUT_MS = 100
# How long one migration keeps trying before it gives up. Within the chart's migrate Job
# (activeDeadlineSeconds 600, backoffLimit 3); `run` retries the whole migrate after it.
BUDGET_S = 120.0


class MigrationBlocked(LockNotAvailable):
    """A migration did not get its locks within its budget; the message is one line naming the
    migration and the transaction most likely in the way. A LockNotAvailable (55P03), so that
    `timer-service migrate` reports it in one line and `run` retries it, as any database error."""


def available(directory: Traversable | None = None) -> list[tuple[int, str, str]]:
    """(version, name, SQL text) of every migration shipped with the package (or in
    `directory`), in order."""
    found = []
    for entry in (directory or resources.files("worker.sql").joinpath("migrations")).iterdir():
        if m := re.match(r"^(\d+)_(\w+)\.sql$", entry.name):
            found.append((int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found)


def statements(text: str) -> list[str]:
    """The statements of a no-transaction migration: each ends a line with `;`."""
    return [part.strip() for part in re.split(r";[ \t]*$", text, flags=re.MULTILINE) if _has_sql(part)]


def _has_sql(part: str) -> bool:
    return any(line.strip() and not line.strip().startswith("--") for line in part.splitlines())


def status(conninfo: str | psycopg.Connection[TupleRow]) -> tuple[list[int], list[tuple[int, str]]]:
    """(versions applied, (version, name) of each shipped migration not applied). A version the
    database has and this build does not ship (a newer release migrated it) is applied, not an
    error. On a session of db.connect given, or one of its own."""
    with db.session(conninfo) as conn:
        applied = _applied(conn)
    return applied, [(version, name) for version, name, _ in available() if version not in applied]


def _applied(conn: psycopg.Connection[TupleRow]) -> list[int]:
    # Before the first migration there is no version table: nothing is applied.
    found = conn.execute("SELECT to_regclass('timer_schema_version') IS NOT NULL").fetchone()
    query = "SELECT version FROM timer_schema_version ORDER BY version"
    return [v for (v,) in conn.execute(query)] if found == (True,) else []


def migrate(
    conninfo: str | psycopg.Connection[TupleRow],
    directory: Traversable | None = None,
    *,
    budget_s: float = BUDGET_S,
) -> list[int]:
    """Apply the missing migrations in order under an advisory lock; return their versions.
    Each migration waits at most LOCK_TIMEOUT_MS at a time for a lock, retried for `budget_s`,
    then MigrationBlocked. On a session of db.connect given (left as it was: every setting reset,
    the lock released), or one of its own."""
    shipped = available(directory)
    with db.session(conninfo) as conn:
        # Every start of a replica after the first finds nothing to apply: it says so after one
        # read, without queueing on the lock behind the replicas starting beside it. A version is
        # recorded only with its migration applied, so all shipped ones there means nothing to do.
        if shipped and {version for version, _, _ in shipped} <= set(_applied(conn)):
            return []
        # A session lock: it outlives each migration's transaction, and a no-transaction one.
        # A second replica migrating waits here for the first to finish, which holds up nobody else.
        _lock(conn)
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS timer_schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {v for (v,) in conn.execute("SELECT version FROM timer_schema_version")}
            applied = []
            for version, name, text in shipped:
                if version in done:
                    continue
                try:
                    _apply_retrying(conn, version, name, text, budget_s)
                finally:
                    conn.execute("RESET ALL")  # a migration's SETs (and the runner's) end with it
                applied.append(version)
            return applied
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))


def _lock(conn: psycopg.Connection[TupleRow]) -> None:
    """The migration lock, tried until got rather than queued for: a session queued on it keeps
    its statement's snapshot while it waits, and the holder's CREATE INDEX CONCURRENTLY waits for
    every older snapshot to end, so each would wait for the other (deadlock detected)."""

    def taken() -> bool:
        return conn.execute("SELECT pg_try_advisory_lock(%s)", (_MIGRATION_LOCK,)).fetchone() == (True,)

    Retrying(
        retry=retry_if_result(lambda got: not got), wait=wait_random_exponential(multiplier=0.05, max=1)
    )(taken)


def _apply_retrying(
    conn: psycopg.Connection[TupleRow], version: int, name: str, text: str, budget_s: float
) -> None:
    """_apply until it gets its locks: each failed attempt has rolled back (a no-transaction file
    is written to be run again from its start), so the next one starts afresh."""
    migration = f"{version:04d}_{name}"

    def waiting(rs: RetryCallState) -> None:
        log.warning(
            "migration waiting for a lock",
            extra={
                "action": "migration_lock_retry",
                "migration": migration,
                "attempt": rs.attempt_number,
                "holder": _lock_holder(conn),
            },
        )

    try:
        for attempt in Retrying(
            retry=retry_if_exception_type(LockNotAvailable),
            # At least one timeout between attempts, so the queue is free at least half the time.
            wait=wait_fixed(LOCK_TIMEOUT_MS / 1000) + wait_random_exponential(multiplier=0.1, max=2),
            stop=stop_after_delay(budget_s),
            before_sleep=waiting,
            reraise=True,
        ):
            with attempt:
                _apply(conn, version, name, text)
    except LockNotAvailable as exc:
        raise MigrationBlocked(
            f"migration {migration} did not get its locks (at most {LOCK_TIMEOUT_MS} ms a wait) in"
            f" {budget_s:g} s; in the way: {_lock_holder(conn)}; end it, or run migrate again once it ends"
        ) from exc


def _apply(conn: psycopg.Connection[TupleRow], version: int, name: str, text: str) -> None:
    record = "INSERT INTO timer_schema_version (version, name) VALUES (%s, %s)"
    short = sql.SQL("SET lock_timeout = {}").format(LOCK_TIMEOUT_MS)
    # Files shipped with the package, not input: safe to run as SQL.
    if text.startswith(NO_TRANSACTION):
        for statement in statements(text):
            conn.execute(sql.SQL("SET lock_timeout = 0") if _concurrently(statement) else short)
            conn.execute(sql.SQL(statement))
        conn.execute(short)
        conn.execute(record, (version, name))
        return
    with conn.transaction():
        conn.execute(short)  # a session SET inside the transaction: a rollback undoes it too
        conn.execute(sql.SQL(text))
        conn.execute(record, (version, name))


def _concurrently(statement: str) -> bool:
    """CREATE / DROP INDEX CONCURRENTLY (outside its comments): it takes SHARE UPDATE EXCLUSIVE,
    which no write waits for, then waits for the transactions older than it. Let it wait."""
    code = "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--"))
    return re.search(r"\bCONCURRENTLY\b", code, re.IGNORECASE) is not None


def _lock_holder(conn: psycopg.Connection[TupleRow]) -> str:
    """The oldest other open transaction holding a table lock in this database: the likeliest to
    be in the way (the attempt that waited has rolled back, so pg_blocking_pids no longer says)."""
    found = conn.execute(
        "SELECT a.pid, a.state, extract(epoch FROM now() - a.xact_start)::int,"
        " left(regexp_replace(a.query, '\\s+', ' ', 'g'), 200)"
        " FROM pg_stat_activity a"
        " WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() AND a.xact_start IS NOT NULL"
        " AND EXISTS (SELECT FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'relation' AND l.granted)"
        " ORDER BY a.xact_start LIMIT 1"
    ).fetchone()
    if found is None:
        return "no open transaction holds a table lock now"
    pid, state, age_s, query = found
    return f"pid {pid} ({state}, transaction open {age_s} s): {query}"
