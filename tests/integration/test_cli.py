"""User mistakes get one clear line and a non-zero exit, never a stack trace."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import query, running_replica
from worker.adapters import migrations
from worker.config import Settings
from worker.service import Replica, SchemaNotReady


def run(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TIMER_")} | env
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env=full_env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"TIMER_LEASE_MS": "abc"}, "TIMER_LEASE_MS"),
        ({"TIMER_PUBLISH_TIMEOUT_MS": "5000"}, "TIMER_PUBLISH_TIMEOUT_MS"),
        ({"TIMER_RETENTION": "1h"}, "TIMER_RETENTION"),
        ({"TIMER_SUBJECT_PREFIX": "a.b"}, "TIMER_SUBJECT_PREFIX"),
        ({"TIMER_SUBJECT_PREFIX": "svc\n"}, "TIMER_SUBJECT_PREFIX"),  # `$` let this through
        ({"TIMER_EVENTS_DUPLICATE_WINDOW": "3s"}, "TIMER_EVENTS_DUPLICATE_WINDOW"),
        ({"TIMER_MAX_HORIZON": "soon"}, "TIMER_MAX_HORIZON"),
    ],
)
def test_a_bad_setting_stops_start_up_with_one_line_naming_it(env: dict[str, str], named: str) -> None:
    result = run("run", **env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and named in lines[0], result.stderr


def test_unreachable_servers_are_one_line_and_the_password_is_not_shown() -> None:
    result = run("status", TIMER_DATABASE_URL="postgresql://u:hunter2@127.0.0.1:1/x")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert "hunter2" not in result.stderr
    result = run(
        "schedule", "--tenant", "a", "--id", "b", "--due-in", "5s", TIMER_NATS_URL="nats://127.0.0.1:1"
    )
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_every_command_has_help() -> None:
    commands = ("migrate", "run", "schedule", "cancel", "status", "list", "describe", "dlq", "console")
    for command in (*commands, "dev", "bench"):
        result = run(command, "--help")
        assert result.returncode == 0 and "usage: timer-service" in result.stdout


def test_migrate_status_lists_applied_and_pending(db_url: str) -> None:
    shipped = [version for version, _, _ in migrations.available()]
    assert shipped[:3] == [1, 2, 3]
    result = run("migrate", "--status", TIMER_DATABASE_URL=db_url)
    listed = ", ".join(map(str, shipped))
    assert (result.returncode, result.stdout) == (0, f"applied: {listed}\npending: none\n"), result.stderr
    query(db_url, "DELETE FROM timer_schema_version WHERE version = 3")
    result = run("migrate", "--status", TIMER_DATABASE_URL=db_url)
    listed = ", ".join(str(v) for v in shipped if v != 3)
    assert (result.returncode, result.stdout) == (1, f"applied: {listed}\npending: 3 (first_claim)\n")


async def test_a_replica_that_does_not_migrate_waits_for_the_schema(settings: Settings, db_url: str) -> None:
    query(db_url, "DELETE FROM timer_schema_version WHERE version = 3")
    replica = Replica(settings.model_copy(update={"migrate": False}))
    with pytest.raises(SchemaNotReady, match="0003_first_claim"):
        replica._schema()  # _connect retries this with back-off until the schema is there
    assert query(db_url, "SELECT 3 IN (SELECT version FROM timer_schema_version)") == [(False,)], (
        "it migrated"
    )
    query(db_url, "INSERT INTO timer_schema_version (version, name) VALUES (3, 'first_claim')")
    async with running_replica(settings, migrate=False) as started:
        assert started.started.is_set()
