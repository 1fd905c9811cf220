"""User mistakes get one clear line and a non-zero exit, never a stack trace."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from typing import Any

import pytest

from tests.helpers import query, running_replica
from worker.adapters.postgres import migrations
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
    assert "hunter2" not in result.stderr and "TIMER_DATABASE_URL" in result.stderr
    result = run(
        "schedule", "--tenant", "a", "--id", "b", "--due-in", "5s", TIMER_NATS_URL="nats://127.0.0.1:1"
    )
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "TIMER_NATS_URL" in result.stderr


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


# Issue 22: mistakes a new user made, each a traceback or a wrong answer before.

NO_SERVERS = {"TIMER_DATABASE_URL": "postgresql://u@127.0.0.1:1/x", "TIMER_NATS_URL": "nats://127.0.0.1:1"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("schedule", "--tenant", "acme", "--id", "x", "--due-in", "5"), "not a duration: '5'"),
        (("schedule", "--tenant", "ac me", "--id", "x", "--due-in", "5m"), "not a tenant id: 'ac me'"),
        (("schedule", "--tenant", "a", "--id", "x", "--due-in", "5m", "--times", "3"), "need --every"),
        (("schedule", "--tenant", "a", "--id", "x", "--due-in", "5m", "--every", "1h"), "bad_repeat"),
        (("dlq", "list", "--reason", "bogus"), "'bogus' is not a reason code: one of bad_correlation_id"),
        (("dlq", "list", "--limit", "0"), "--limit: not a whole number of at least 1"),
        (("list", "--limit", "0"), "--limit: not a whole number of at least 1"),
        (("list", "--tenant", "a", "--state", "sleeping"), "not a state: one of Scheduled"),
        (("dlq", "purge", "--before", "-7x"), "--before: not a duration"),
    ],
)
def test_a_usage_mistake_is_one_line_and_exit_2(args: tuple[str, ...], says: str) -> None:
    result = run(*args, **NO_SERVERS)  # refused before any server is asked
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["dlq", "purge", "--tenant", "acme", "--before", "-7d", "--yes"],
        ["dlq", "list", "--since", "-1h"],
        ["list", "--tenant", "acme", "--due-from", "-1h", "--due-to", "+5m"],
    ],
)
def test_relative_times_are_taken_as_help_shows_them(argv: list[str]) -> None:
    from datetime import UTC, datetime

    from worker.ops import cli

    args = cli.build_parser().parse_args(cli._join_relative_times(argv))
    now = datetime.now(UTC)
    times = [getattr(args, k) for k in ("before", "since", "due_from", "due_to") if getattr(args, k, None)]
    assert times and all(isinstance(t, datetime) for t in times)
    assert any(t < now for t in times)


def test_state_is_taken_in_any_case() -> None:
    from worker.ops import cli

    assert cli.build_parser().parse_args(["list", "--tenant", "a", "--state", "reached"]).state == "Reached"


@pytest.mark.parametrize(
    "args", [("dlq", "list"), ("dlq", "show", "1"), ("describe", "--tenant", "a", "--id", "b")]
)
def test_servers_not_there_are_one_line_naming_the_setting(args: tuple[str, ...]) -> None:
    result = run(*args, **NO_SERVERS)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "TIMER_NATS_URL" in result.stderr or "TIMER_DATABASE_URL" in result.stderr


def test_no_private_nats_py_api() -> None:
    """nats-py's JetStreamContext is a JetStreamManager: `js._jsm` is a private alias of itself."""
    from pathlib import Path

    root = Path(__file__).parents[3] / "worker"
    users = [str(p) for p in root.rglob("*.py") if "._jsm" in p.read_text(encoding="utf-8")]
    assert users == []


async def test_schedule_from_file_sends_the_good_lines_and_names_the_bad_ones(
    settings: Settings, tmp_path: Any
) -> None:
    """Issue 23: a bulk import, each line checked as the service would, sent in batches."""
    import json as _json

    from tests.helpers import settings_env
    from worker.adapters.jetstream.broker import Broker

    broker = Broker(settings)
    await broker.connect()
    await broker.ensure_streams()
    try:
        lines = [
            _json.dumps({"tenantId": "acme", "serviceCallId": f"f-{i}", "dueAt": "2030-01-01T00:00:00Z"})
            for i in range(1500)
        ]
        lines.insert(2, '{"tenantId": "acme", "serviceCallId": "late", "dueAt": "tomorrow"}')
        lines.insert(5, "not json")
        lines.insert(7, "")
        lines.insert(9, '{"serviceCallId": "no-tenant", "dueAt": "2030-01-01T00:00:00Z"}')
        path = tmp_path / "timers.jsonl"
        path.write_text("\n".join(lines) + "\n")
        proc = await asyncio.to_thread(run, "schedule", "--from-file", str(path), **settings_env(settings))
        assert proc.returncode == 1, proc.stderr
        summary, where = proc.stdout.splitlines()
        assert summary == "sent 1500, duplicate 0, rejected 3 (not sent), not stored 0"
        assert where.startswith(
            "a replica applies each shortly, or rejects it to the DLQ (quota_exceeded, say):"
        )
        assert re.search(r"`timer-service dlq list --since \d{4}-\d\d-\d\dT[\d:.]+Z`$", where), where
        errors = proc.stderr.splitlines()
        assert errors[0].startswith("line 3: bad_due_at: ")
        assert errors[1].startswith("line 6: invalid_json: ")
        assert errors[2] == "line 10: missing_field: tenantId is required"
        info = await broker.js.stream_info(settings.command_stream)
        assert info.state.messages == 1500
    finally:
        await broker.close()


async def test_schedule_from_file_sends_each_line_once_as_the_service_checked_it(
    settings: Settings, tmp_path: Any
) -> None:
    """Both line forms are sent once each, in their right form: an envelope line as it is (it
    was wrapped in a second envelope, which the replica refused), a flat line in an envelope that
    keeps its own timestampMs (it was replaced). The check is the replica's with the settings'
    limits (TIMER_MAX_PAYLOAD_BYTES was ignored); a line past a command's size is refused by its
    number and the lines after it go on. The timers exist once a replica applied them, and none
    was rejected to the DLQ."""
    import json as _json

    from tests.helpers import settings_env, until
    from worker.adapters.jetstream.broker import Broker
    from worker.contract import MAX_BODY_BYTES
    from worker.ops.reads import connect, describe

    settings = settings.model_copy(update={"max_payload_bytes": 100})
    due = "2030-01-01T00:00:00Z"

    def flat(sid: str, **more: Any) -> str:
        return _json.dumps({"tenantId": "acme", "serviceCallId": sid, "dueAt": due, **more})

    envelope = _json.dumps(
        {
            "id": "import-1",
            "type": "ScheduleTimer",
            "tenantId": "acme",
            "timestampMs": 1_700_000_000_000,
            "payload": {"tenantId": "acme", "serviceCallId": "enveloped", "dueAt": due},
        }
    )
    lines = [
        flat("flat"),
        flat("stamped", timestampMs=1234),
        envelope,
        _json.dumps({"type": "ScheduleTimer", "payload": _json.loads(flat("no-id"))}),
        flat("big-data", data="x" * 100),  # 102 bytes as events carry it: over TIMER_MAX_PAYLOAD_BYTES
        flat("huge", data="x" * MAX_BODY_BYTES),
        flat("after"),
    ]
    path = tmp_path / "timers.jsonl"
    path.write_text("\n".join(lines) + "\n")
    env = settings_env(settings)
    broker = Broker(settings)
    await broker.connect()
    await broker.ensure_streams()
    try:
        proc = await asyncio.to_thread(run, "schedule", "--from-file", str(path), **env)
        assert proc.returncode == 1, proc.stderr
        assert proc.stdout.splitlines()[0] == "sent 5, duplicate 0, rejected 2 (not sent), not stored 0"
        assert proc.stderr.splitlines() == [
            "line 5: payload_too_large: data is 102 bytes as its events carry it, more than 100",
            f"line 6: body_too_large: more than {MAX_BODY_BYTES} bytes, not read",
        ]
        sent = [await broker.js.get_msg(settings.command_stream, seq) for seq in range(1, 6)]
        bodies = [_json.loads(m.data or b"") for m in sent]
        # The envelope line as it is, its id as Nats-Msg-Id; the flat lines each in one envelope.
        assert sent[2].data == envelope.encode()
        assert (sent[2].headers or {}).get("Nats-Msg-Id") == "import-1"
        assert [b["payload"] for b in bodies[:2]] == [_json.loads(line) for line in lines[:2]]
        assert "timestampMs" not in bodies[1]  # the line's own stands
        assert isinstance(bodies[0]["timestampMs"], int)
        assert {b["type"] for b in bodies} == {"ScheduleTimer"}
        # Imported again: JetStream has that id, and says so.
        path.write_text(envelope + "\n")
        again = await asyncio.to_thread(run, "schedule", "--from-file", str(path), **env)
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines()[0] == "sent 0, duplicate 1, rejected 0 (not sent), not stored 0"

        url = settings.database_url.get_secret_value()

        def applied() -> bool:
            with connect(url) as conn:
                return all(
                    describe(conn, "acme", s) for s in ("flat", "stamped", "enveloped", "no-id", "after")
                )

        async with running_replica(settings):
            await until(applied, what="every line applied")
        assert (await broker.js.stream_info(settings.dlq_stream)).state.messages == 0
    finally:
        await broker.close()


async def test_schedule_says_the_command_was_sent_and_where_a_rejection_of_it_goes(
    settings: Settings,
) -> None:
    """JetStream storing a ScheduleTimer is not the service applying it: one over the tenant's quota
    is rejected by the replica, and the DLQ command `schedule` printed finds it."""
    from tests.helpers import settings_env, until
    from worker.ops.reads import connect, describe

    env = settings_env(settings)
    async with running_replica(settings, tenant_max_pending=1):
        first = await asyncio.to_thread(
            run, "schedule", "--tenant", "acme", "--id", "one", "--due-in", "1h", **env
        )
        assert first.returncode == 0, first.stderr
        sent, where = first.stdout.splitlines()
        assert re.fullmatch(r"sent acme/one \(first occurrence \S+Z\): in the command stream", sent), sent
        assert where == (
            "a replica applies it shortly (`timer-service describe --tenant acme --id one`), or rejects it"
            " to the DLQ (quota_exceeded, say): `timer-service dlq list --tenant acme --id one`"
        )
        url = settings.database_url.get_secret_value()

        def stored(sid: str) -> bool:
            with connect(url) as conn:
                return describe(conn, "acme", sid) is not None

        await until(lambda: stored("one"), what="one applied")
        over = await asyncio.to_thread(
            run, "schedule", "--tenant", "acme", "--id", "two", "--due-in", "1h", **env
        )
        assert over.returncode == 0 and over.stdout.startswith("sent acme/two "), over.stderr
        (command,) = re.findall(r"`(timer-service dlq list [^`]+)`", over.stdout)
        listed: list[str] = []

        async def in_dlq() -> bool:
            done = await asyncio.to_thread(run, *command.split()[1:], **env)
            listed[:] = [done.stdout]
            return "quota_exceeded" in done.stdout

        await until(in_dlq, what="the rejection in the DLQ")
    assert "two" in listed[0] and not stored("two")


# The command line's own settings and its JSON (issue 34, the first hour).


def test_the_server_options_stand_for_the_variables(settings: Settings) -> None:
    """--database-url and --nats-url, before the command's name or after it, win over the
    variables; a failure names the option that was given, its password masked."""
    from tests.helpers import settings_env

    env = settings_env(settings)
    servers = ["--database-url", env["TIMER_DATABASE_URL"], "--nats-url", env["TIMER_NATS_URL"]]
    for argv in ([*servers, "status"], ["status", *servers]):
        done = run(*argv, **(env | NO_SERVERS))
        assert done.returncode == 0, (argv, done.stderr)
        assert "NATS did not answer" not in done.stdout, done.stdout
    done = run("status", "--database-url", "postgresql://u:hunter2@127.0.0.1:1/x", **env)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "Postgres (--database-url): " in done.stderr and "hunter2" not in done.stderr, done.stderr
    done = run(
        "--nats-url", "nats://127.0.0.1:1", "schedule", "--tenant", "a", "--id", "b", "--due-in", "5s", **env
    )
    assert done.returncode == 1 and "NATS (--nats-url): " in done.stderr, done.stderr


# Commands that print no answer of their own: a server's logs, the console's pages, dev's live
# view, the benchmarks' table (which has its own --json, tools/bench).
NO_ANSWER = {"run", "console", "dev", "bench"}


def test_every_command_that_answers_takes_json() -> None:
    import argparse

    from worker.ops import cli

    def commands(
        parser: argparse.ArgumentParser, path: str = ""
    ) -> list[tuple[str, argparse.ArgumentParser]]:
        found = []
        for action in parser._actions:  # argparse lists its subcommands nowhere public
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found += commands(child, f"{path} {name}".strip())
        return found or [(path, parser)]

    found = dict(commands(cli.build_parser()))
    assert {"cancel", "dlq replay", "consumer add", "migrate-streams"} <= set(found)
    missing = [n for n, p in found.items() if n not in NO_ANSWER and "--json" not in p.format_help()]
    assert missing == []


def camel_only(value: Any) -> bool:
    if isinstance(value, dict):
        return all("_" not in k and camel_only(v) for k, v in value.items())
    if isinstance(value, list):
        return all(camel_only(v) for v in value)
    return True


async def test_the_json_answers_are_json_in_camel_case(settings: Settings) -> None:
    """Each command's --json, on a real fleet: one JSON document on stdout, camelCase keys."""
    import json

    from tests.helpers import settings_env, until
    from worker.ops.reads import connect, describe

    env = settings_env(settings)
    url = settings.database_url.get_secret_value()

    def stored() -> bool:
        with connect(url) as conn:
            return describe(conn, "acme", "j-1") is not None

    async with running_replica(settings):
        answers = {}
        for argv in (
            ("migrate",),
            ("migrate", "--status"),
            ("schedule", "--tenant", "acme", "--id", "j-1", "--due-in", "1h"),
            ("pause", "--tenant", "acme", "--id", "j-1"),
            ("resume", "--tenant", "acme", "--id", "j-1"),
            ("cancel", "--tenant", "acme", "--id", "j-1"),
            ("consumer", "add", "--tenant", "acme"),
            ("dlq", "purge", "--tenant", "acme"),
            ("migrate-streams",),
        ):
            if argv[0] == "pause":
                await until(stored, what="j-1 stored")
            done = await asyncio.to_thread(run, *argv, "--json", **env)
            assert done.returncode == 0, (argv, done.stderr)
            answers[argv] = json.loads(done.stdout)
            assert camel_only(answers[argv]), (argv, done.stdout)
    assert answers[("migrate",)] == {"applied": []}
    assert answers[("migrate", "--status")]["pending"] == []
    sent = answers[("schedule", "--tenant", "acme", "--id", "j-1", "--due-in", "1h")]
    assert (sent["tenantId"], sent["serviceCallId"]) == ("acme", "j-1") and sent["firstOccurrence"].endswith(
        "Z"
    )
    assert answers[("pause", "--tenant", "acme", "--id", "j-1")]["sent"] == "pause"
    cancelled = answers[("cancel", "--tenant", "acme", "--id", "j-1")]
    assert cancelled["outcome"] == "cancelled", cancelled
    assert {c["filterSubject"] for c in answers[("consumer", "add", "--tenant", "acme")]["consumers"]}
    assert answers[("dlq", "purge", "--tenant", "acme")] == {"matching": 0}
    assert answers[("migrate-streams",)] == {"drained": True}  # a limits stream already: nothing to move
