"""A replica's start-up: Postgres and NATS come up side by side, and what stops start-up still
stops it, with one line (service.Replica.connect)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import psycopg
from psycopg.conninfo import conninfo_to_dict

from tests.helpers import database_encoded, settings_env
from worker.adapters.postgres import migrations
from worker.config import Settings
from worker.devkit.harness import replica_env


async def test_a_database_not_in_utf8_stops_start_up_while_nats_fails_beside_it(
    settings: Settings, pg_server_url: str
) -> None:
    """The streams are missing and not the replica's to create: the NATS side fails, and would be
    retried. The database's refusal, which no retry fixes, still ends start-up: exit 2, its one
    line last, no traceback (a failure side by side is raised as itself, not as a group). That
    NATS failing first cannot hide it, whatever the timing: tests/unit/test_startup.py."""
    with database_encoded(pg_server_url, "SQL_ASCII") as url:
        env = replica_env(
            settings_env(settings) | {"TIMER_DATABASE_URL": url, "TIMER_CREATE_STREAMS": "false"}, "not-utf8"
        )
        cmd = [sys.executable, "-m", "worker", "run"]
        done = await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, timeout=60)
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"timer-service: database {conninfo_to_dict(url)['dbname']} is encoded SQL_ASCII; timer-service"
        " needs UTF8 (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
    )


async def test_a_start_on_a_migrated_database_does_not_queue_for_the_migration_lock(db_url: str) -> None:
    """Replicas starting together each read that nothing is pending; none waits in turn for the
    lock another holds (before, each took it to find nothing to do)."""
    with psycopg.connect(db_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (migrations._MIGRATION_LOCK,))
        applied = await asyncio.wait_for(asyncio.to_thread(migrations.migrate, db_url), timeout=20)
    assert applied == []
    assert migrations.status(db_url)[1] == []
