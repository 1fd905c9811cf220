"""Versioned schema migrations from sql/migrations, safe when N replicas run them at once: each in
its own transaction (or statement by statement, `-- migration: no-transaction`), each lock wait
bounded to LOCK_TIMEOUT_MS and retried, so the fleet is never held up longer at a time."""

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
# How long one migration keeps trying before it gives up, within the chart's migrate Job.
BUDGET_S = 120.0


class MigrationBlocked(LockNotAvailable):
    """A migration did not get its locks within its budget: one line naming it and the likely
    blocker. A LockNotAvailable, so `run` retries it as any database error."""


def available(directory: Traversable | None = None) -> list[tuple[int, str, str]]:
    """(version, name, SQL text) of each shipped migration (or in `directory`), in order."""
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
    """(versions applied, (version, name) of each shipped one not applied)."""
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
    """Apply the missing migrations in order under an advisory lock; return their versions. On the
    session given (left as it was), or one of its own."""
    shipped = available(directory)
    with db.session(conninfo) as conn:
        # All applied: said after one read, not queued on the lock behind the replicas starting too.
        if shipped and {version for version, _, _ in shipped} <= set(_applied(conn)):
            return []
        # A session lock: it outlives each migration's transaction; a second migrator waits here.
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
    """The migration lock, tried until got, not queued for: a queued session's snapshot would
    deadlock with the holder's CREATE INDEX CONCURRENTLY."""

    def taken() -> bool:
        return conn.execute("SELECT pg_try_advisory_lock(%s)", (_MIGRATION_LOCK,)).fetchone() == (True,)

    Retrying(
        retry=retry_if_result(lambda got: not got), wait=wait_random_exponential(multiplier=0.05, max=1)
    )(taken)


def _apply_retrying(
    conn: psycopg.Connection[TupleRow], version: int, name: str, text: str, budget_s: float
) -> None:
    """_apply until it gets its locks; each failed attempt has rolled back."""
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
    """CREATE / DROP INDEX CONCURRENTLY (outside comments): it blocks no write, so let it wait."""
    code = "\n".join(line for line in statement.splitlines() if not line.strip().startswith("--"))
    return re.search(r"\bCONCURRENTLY\b", code, re.IGNORECASE) is not None


def _lock_holder(conn: psycopg.Connection[TupleRow]) -> str:
    """The oldest other transaction holding a table lock here: the likeliest in the way."""
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
