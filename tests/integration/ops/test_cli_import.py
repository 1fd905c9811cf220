"""`cancel --from-file` (worker/ops/cli_import.py) against real servers: each line checked as a
replica will check it, the good ones sent once in batches and applied, the others named by line.
`schedule --from-file`, the same path, is tested in test_cli.py."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tests.helpers import running_replica, settings_env, until
from tests.integration.ops.test_cli import run
from worker.client import TimerClient
from worker.config import Settings
from worker.ops.reads import connect, describe


def states(settings: Settings, *keys: tuple[str, str]) -> list[str | None]:
    with connect(settings.database_url.get_secret_value()) as conn:
        return [(view or {}).get("state") for view in (describe(conn, t, s) for t, s in keys)]


async def test_cancel_from_file_cancels_the_good_lines_and_names_the_bad_ones(
    settings: Settings, tmp_path: Path
) -> None:
    env = settings_env(settings)
    keys = [("acme", f"c-{i}") for i in range(5)] + [("globex", "g-1")]
    async with running_replica(settings):
        async with await TimerClient.connect(settings.nats_url, settings.subject_prefix) as timers:
            due = datetime.now(UTC) + timedelta(hours=1)
            for tenant, sid in keys:
                await timers.schedule(tenant, sid, due)
        await until(lambda: states(settings, *keys) == ["Scheduled"] * 6, what="every timer stored")
        lines = [
            "c-0",
            " c-1 ",  # the blanks around a bare id are not part of it
            json.dumps({"tenantId": "globex", "serviceCallId": "g-1"}),  # its own tenant, not --tenant's
            "",
            json.dumps({"serviceCallId": "c-3"}),  # JSON names its tenant, or is refused
            "c-2",
            "{not json",
        ]
        path = tmp_path / "cancel.txt"
        path.write_text("\n".join(lines) + "\n")
        done = await asyncio.to_thread(run, "cancel", "--tenant", "acme", "--from-file", str(path), **env)
        assert done.returncode == 1, done.stderr
        summary, where = done.stdout.splitlines()
        assert summary == "sent 4, duplicate 0, rejected 2 (not sent), not stored 0"
        assert "(timer_stuck, say): `timer-service dlq list --since " in where, where
        errors = done.stderr.splitlines()
        assert errors[0] == "line 5: missing_field: tenantId is required", errors
        assert errors[1].startswith("line 7: invalid_json: ") and len(errors) == 2, errors
        expected = ["Cancelled", "Cancelled", "Cancelled", "Scheduled", "Scheduled", "Cancelled"]
        await until(lambda: states(settings, *keys) == expected, what="the four lines applied")

        # From stdin, as JSON: the same answer for a program, and a clean run exits 0.
        done = await asyncio.to_thread(
            run, "cancel", "--tenant", "acme", "--from-file", "-", "--json", stdin="c-3\nc-4\n", **env
        )
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert {k: answer[k] for k in ("sent", "duplicate", "rejected", "notStored")} == {
            "sent": 2,
            "duplicate": 0,
            "rejected": 0,
            "notStored": 0,
        }
        assert answer["dlq"].startswith("timer-service dlq list --since ")
        await until(lambda: states(settings, *keys) == ["Cancelled"] * 6, what="stdin's lines applied")


def test_a_bare_id_without_a_tenant_is_named_and_nothing_is_sent(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "cancel.txt"
    path.write_text("c-0\n")
    done = run("cancel", "--from-file", str(path), **settings_env(settings))
    assert done.returncode == 1
    assert done.stdout.splitlines() == ["sent 0, duplicate 0, rejected 1 (not sent), not stored 0"]
    assert done.stderr == "line 1: a bare serviceCallId needs --tenant (or a JSON line with its tenantId)\n"
