"""Versioned schema migrations from sql/migrations, safe when N replicas run them at once.

Each migration runs in a transaction of its own with its version row, so a failure leaves the
ones before it applied. A file whose first line is `-- migration: no-transaction` runs statement
by statement outside any transaction (`CREATE INDEX CONCURRENTLY` cannot run inside one): every
statement in it ends a line with `;` and can be run again after a failure half-way
(tests/integration/test_migrations.py holds every file to these rules and the README's upgrade rules).
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable

import psycopg
from psycopg import sql

from worker.adapters import db

# Any constant works; it only has to be the same for every replica.
_MIGRATION_LOCK = 0x7115_E4
NO_TRANSACTION = "-- migration: no-transaction"


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


def status(conninfo: str) -> tuple[list[int], list[tuple[int, str]]]:
    """(versions applied, (version, name) of each shipped migration not applied). A version the
    database has and this build does not ship (a newer release migrated it) is applied, not an error."""
    with db.connect(conninfo) as conn:
        # Before the first migration there is no version table: nothing is applied.
        found = conn.execute("SELECT to_regclass('timer_schema_version') IS NOT NULL").fetchone()
        query = "SELECT version FROM timer_schema_version ORDER BY version"
        applied = [v for (v,) in conn.execute(query)] if found == (True,) else []
    return applied, [(version, name) for version, name, _ in available() if version not in applied]


def migrate(conninfo: str, directory: Traversable | None = None) -> list[int]:
    """Apply the missing migrations in order under an advisory lock; return their versions."""
    with db.connect(conninfo) as conn:
        # A session lock: it outlives each migration's transaction, and a no-transaction one.
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS timer_schema_version ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {v for (v,) in conn.execute("SELECT version FROM timer_schema_version")}
            applied = []
            for version, name, text in available(directory):
                if version in done:
                    continue
                _apply(conn, version, name, text)
                conn.execute("RESET ALL")  # a migration's SET (lock_timeout) ends with it
                applied.append(version)
            return applied
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))


def _apply(conn: psycopg.Connection[object], version: int, name: str, text: str) -> None:
    record = "INSERT INTO timer_schema_version (version, name) VALUES (%s, %s)"
    # Files shipped with the package, not input: safe to run as SQL.
    if text.startswith(NO_TRANSACTION):
        for statement in statements(text):
            conn.execute(sql.SQL(statement))
        conn.execute(record, (version, name))
        return
    with conn.transaction():
        conn.execute(sql.SQL(text))
        conn.execute(record, (version, name))
