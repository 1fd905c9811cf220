"""Every example in the README and docs/ works as written (issue 22).

The `timer-service ...` lines of their code blocks run, in the order they are written, against the
test servers, with the state they take for granted set up first (a DLQ entry at sequence 1234, a
`fixed.json`); the README's Python client snippet runs as written. A new example is run, or
listed in NOT_RUN with why.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import iso_in, jetstream, publish_raw, running_replica, settings_env, until
from worker.client import TimerClient
from worker.config import Settings
from worker.ops import dlq

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Lines not run here, and why: long-running servers, or minutes of load.
NOT_RUN = {
    "bench": "minutes of load: tests/integration/bench/test_bench.py runs the scenarios small",
}
# A command line: optional VAR=value words, optional .venv/bin/, then timer-service.
COMMAND = re.compile(r"^(?:[A-Z_]+=\S*\s+)*(?:\.venv/bin/)?(timer-service\s.*)$")


def fenced_lines(path: Path, language: str | None = None) -> list[list[str]]:
    """The code blocks of a Markdown file (those of `language` when given), as lists of lines."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if current is None:
                current = [] if language is None or line[3:].strip() == language else None
                if current is None:
                    current = ["\0skip"]
            else:
                if current[:1] != ["\0skip"]:
                    blocks.append(current)
                current = None
            continue
        if current is not None:
            current.append(line)
    return blocks


def cli_examples() -> list[tuple[str, str]]:
    """(file, command line) for every `timer-service` line of every code block, in order."""
    found = []
    for path in DOCS:
        for block in fenced_lines(path):
            for line in block:
                if m := COMMAND.match(line.strip()):
                    found.append((path.name, m.group(1)))
    return found


def test_the_examples_are_found() -> None:
    examples = [line for _, line in cli_examples()]
    assert "timer-service dlq purge --tenant acme --before -7d --yes" in examples
    assert any(line.startswith("timer-service bench") for line in examples)


async def test_every_cli_example_runs_as_written(settings: Settings, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMER_")} | settings_env(settings)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    (tmp_path / "fixed.json").write_text(
        json.dumps({"tenantId": "acme", "serviceCallId": "sc-43", "dueAt": iso_in(3600)})
    )
    async with running_replica(settings):
        # `dlq show 1234`: the next DLQ entry gets sequence 1234 (a purge up to a sequence past the
        # last one moves the stream's first sequence there), a ScheduleTimer rejected as bad_due_at.
        async with jetstream(settings) as js:
            await js.purge_stream(settings.dlq_stream, seq=1234)
            await publish_raw(
                js, settings, "acme", "schedule", {"tenantId": "acme", "serviceCallId": "sc-42", "dueAt": "x"}
            )
        async with dlq.open_dlq(settings) as q:
            await until(lambda: q.get(1234), what="DLQ entry 1234")

        ran = []
        for source, line in cli_examples():
            words = shlex.split(line, comments=True)
            if words[1] in NOT_RUN:
                continue
            done = await asyncio.to_thread(
                subprocess.run,
                ["sh", "-c", line],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0 and "Traceback" not in done.stderr, (source, line, done.stderr)
            ran.append(line)
    assert any(line.startswith("timer-service dlq replay 1234 --body fixed.json") for line in ran)


@pytest.mark.parametrize("before", ["new", "cancelled"])
async def test_the_readme_client_snippet_runs_as_written(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, before: str
) -> None:
    """On a new key, and on one that already holds a timer (cancelled, with another correlationId):
    the snippet shows its own command's effect, not the timer as it was before."""
    readme = ROOT / "README.md"
    (snippet,) = [b for b in fenced_lines(readme, "python") if any("TimerClient" in line for line in b)]
    code = compile("\n".join(snippet), str(readme), "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    monkeypatch.setenv("TIMER_NATS_URL", settings.nats_url)
    out = io.StringIO()
    # The snippet uses the default subject prefix, `svc`: a replica of its own on it.
    async with running_replica(settings, subject_prefix="svc"):
        if before == "cancelled":
            async with await TimerClient.connect(settings.nats_url) as timers:
                due = datetime.now(UTC) + timedelta(hours=1)
                await timers.schedule("acme", "sc-42", due, correlation_id="old")
                await timers.cancel("acme", "sc-42")

                async def cancelled() -> bool:
                    timer = await timers.get("acme", "sc-42")
                    return timer is not None and timer["state"] == "Cancelled"

                await until(cancelled, what="sc-42 cancelled")
        with contextlib.redirect_stdout(out):
            await eval(code, {})  # a coroutine: the snippet has top-level await
    assert out.getvalue() == "Scheduled\n"
