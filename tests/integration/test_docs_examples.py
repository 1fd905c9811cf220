"""Every example in the README and docs/ works as written (issue 22), and every link lands.

The `timer-service ...` lines of their code blocks run, in the order they are written, against the
test servers, with the state they take for granted set up first (a DLQ entry at sequence 1234, a
`fixed.json`, a `to-cancel.txt`); the README's Python client snippet runs as written. A new
example is run, or listed in NOT_RUN with why. The README's quick start runs as a new user
follows it (issue 34): `timer-service dev`, then its lines in another shell, then the console.
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
import signal
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import iso_in, jetstream, publish_raw, running_replica, settings_env, until
from worker.client import TimerClient
from worker.config import Settings
from worker.devkit import polling
from worker.ops import dlq

ROOT = Path(__file__).parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where relative links are checked: the docs, and the pages beside them that link into them.
LINKED = [
    *DOCS,
    ROOT / "CONTRIBUTING.md",
    ROOT / "RELEASING.md",
    ROOT / "deploy/helm/timer-service/README.md",
]
QUICK_START = "Quick start"
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


def section(path: Path, heading: str) -> str:
    """The text under a `## heading` of a Markdown file, up to the next `## `."""
    text = path.read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def blocks_of(text: str, language: str) -> list[list[str]]:
    """The code blocks of Markdown text in one language, as lists of lines."""
    return [b.splitlines() for b in re.findall(rf"^```{language}\n(.*?)^```$", text, re.M | re.S)]


def cli_examples() -> list[tuple[str, str]]:
    """(file, command line) for every `timer-service` line of every code block, in order; not
    the README's quick start, which test_the_readme_quick_start_runs_as_written runs against
    `timer-service dev` as a user would (it waits for its timer to fire)."""
    quick = {line for block in blocks_of(section(ROOT / "README.md", QUICK_START), "sh") for line in block}
    found = []
    for path in DOCS:
        for block in fenced_lines(path):
            if path.name == "README.md" and set(block) <= quick:
                continue
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
    (tmp_path / "to-cancel.txt").write_text("sc-42\nsc-43\n")  # docs/USING.md's printf makes it
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


@pytest.mark.timeout(300)  # dev's start-up is read line by line: a dev that hangs fails here
def test_the_readme_quick_start_runs_as_written(tmp_path: Path) -> None:
    """What the quick start says, in its order: `make dev` (which is `timer-service dev`) on a
    machine with no servers; in another shell its lines, the export line replaced by the one dev
    printed (the one thing a user pastes); the timer fires; the console shows it Reached; Ctrl-C
    stops it all."""
    text = section(ROOT / "README.md", QUICK_START)
    start, shell, after = blocks_of(text, "sh")
    assert start == ["make dev"]
    assert "\t$(BIN)/timer-service dev\n" in (ROOT / "Makefile").read_text()
    pasted = [i for i, line in enumerate(shell) if line.startswith("export TIMER_DATABASE_URL=")]
    assert len(pasted) == 1, shell
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMER_")} | {"TMPDIR": str(tmp_path)}
    dev = subprocess.Popen(
        [sys.executable, "-m", "worker", "dev"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell's foreground job: Ctrl-C reaches all
    )
    try:
        printed = _until_export_line(dev)
        console = re.search(r"^console  (http://\S+)  \(token (\S+);", printed, re.M)
        (export,) = re.findall(r"^export TIMER_DATABASE_URL=.*$", printed, re.M)
        assert console, printed
        shell[pasted[0]] = export
        done = subprocess.run(
            ["sh", "-ec", "\n".join(shell)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0 and done.stdout.startswith("sent acme/hello "), (done.stdout, done.stderr)

        # The shell keeps what its first lines set: the venv and the servers.
        prelude = [line for line in shell if not line.startswith("timer-service ")]
        fired: list[str] = []

        def reached() -> bool:
            look = subprocess.run(
                ["sh", "-ec", "\n".join(prelude + after)], cwd=ROOT, env=env, capture_output=True, text=True
            )
            fired[:] = [look.stdout + look.stderr]
            return re.search(r"^state\s+Reached$", look.stdout, re.M) is not None

        polling.until(reached, timeout=60, what=lambda: f"the timer to fire: {fired}", interval=0.5)
        page = urllib.request.Request(
            f"{console.group(1)}/timers/acme/hello", headers={"Authorization": f"Bearer {console.group(2)}"}
        )
        with urllib.request.urlopen(page, timeout=10) as answer:
            assert answer.status == 200 and "Reached" in answer.read().decode()
    finally:
        os.killpg(dev.pid, signal.SIGINT)
        out, err = dev.communicate(timeout=60)
    assert dev.returncode == 0, (out, err)
    assert out.strip().splitlines()[-1].startswith("stopped: scheduled="), out


def _until_export_line(dev: subprocess.Popen[str]) -> str:
    """dev's output up to its export line (it prints it once its servers, replicas and console
    are up); the live view follows. A dev that ends first fails here with what it said."""
    assert dev.stdout is not None
    lines: list[str] = []
    for line in dev.stdout:
        lines.append(line)
        if line.startswith("export "):
            return "".join(lines)
    raise AssertionError(
        f"dev ended without its export line: {''.join(lines)}{dev.stderr and dev.stderr.read()}"
    )


def _prose(text: str, spans: bool = True) -> list[str]:
    """The lines of Markdown outside code blocks; without inline code spans unless `spans` is False."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line if not spans else re.sub(r"`[^`]*`", "", line))
    return lines


def _anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings: lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(path.read_text(encoding="utf-8"), spans=False):
        if m := re.match(r"#{1,6} (.*)", line):
            base = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            found.add(f"{base}-{seen[base]}" if base in seen else base)
            seen[base] = seen.get(base, 0) + 1
    return found


def test_every_relative_link_lands_on_a_file_and_its_section() -> None:
    """The README's depth moved to docs/ (issue 34): a link into what moved must follow it."""
    link = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
    broken = []
    for path in LINKED:
        for target in link.findall("\n".join(_prose(path.read_text(encoding="utf-8")))):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            name, _, anchor = target.partition("#")
            dest = (path.parent / name).resolve() if name else path
            if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert broken == []
