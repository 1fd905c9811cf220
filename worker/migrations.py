"""Versioned schema migrations from sql/migrations, safe when N replicas run them at once."""

from __future__ import annotations

import re
from importlib import resources

import psycopg
from psycopg import sql

from worker.store import session_conninfo

# Any constant works; it only has to be the same for every replica.
_MIGRATION_LOCK = 0x7115_E4


def available() -> list[tuple[int, str, str]]:
    """(version, name, SQL text) of every migration shipped with the package, in order."""
    found = []
    for entry in resources.files("worker.sql").joinpath("migrations").iterdir():
        if m := re.match(r"^(\d+)_(\w+)\.sql$", entry.name):
            found.append((int(m.group(1)), m.group(2), entry.read_text(encoding="utf-8")))
    return sorted(found)


def status(conninfo: str) -> tuple[list[int], list[tuple[int, str]]]:
    """(versions applied, (version, name) of each shipped migration not applied). A version the
    database has and this build does not ship (a newer release migrated it) is applied, not an error."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        # Before the first migration there is no version table: nothing is applied.
        found = conn.execute("SELECT to_regclass('timer_schema_version') IS NOT NULL").fetchone()
        query = "SELECT version FROM timer_schema_version ORDER BY version"
        applied = [v for (v,) in conn.execute(query)] if found == (True,) else []
    return applied, [(version, name) for version, name, _ in available() if version not in applied]


def migrate(conninfo: str) -> list[int]:
    """Apply the missing migrations in one transaction under an advisory lock; return their versions."""
    with psycopg.connect(session_conninfo(conninfo), autocommit=False) as conn:
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS timer_schema_version ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {v for (v,) in conn.execute("SELECT version FROM timer_schema_version")}
        applied = []
        for version, name, text in available():
            if version in done:
                continue
            # A file shipped with the package, not input: safe to run as SQL.
            conn.execute(sql.SQL(text))
            conn.execute("INSERT INTO timer_schema_version (version, name) VALUES (%s, %s)", (version, name))
            applied.append(version)
        conn.commit()
        return applied
