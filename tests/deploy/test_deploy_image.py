"""The Dockerfile and .dockerignore, read instruction by instruction (no Docker engine here)."""

from __future__ import annotations

import json
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from worker.ops.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
VALUES = ROOT / "deploy" / "helm" / "timer-service" / "values.yaml"
Tool = Callable[[dict[str, Any]], dict[str, Any]]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def _stages() -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for word, rest in _instructions():
        if word == "FROM":
            stages.append([])
        if stages:
            stages[-1].append((word, rest))
    return stages


def _args(stage: list[tuple[str, str]], word: str) -> list[str]:
    return [rest for w, rest in stage if w == word]


@pytest.fixture(scope="module")
def chart_values(deploy_tool: Tool) -> dict[str, Any]:
    values: dict[str, Any] = deploy_tool({"yaml": [str(VALUES)]})["yaml"][str(VALUES)][0]
    return values


def test_pinned_base() -> None:
    args = dict(rest.split("=", 1) for word, rest in _instructions() if word == "ARG" and "=" in rest)
    # A full Python patch release on a named Debian release: never `latest` or a bare `3.11`.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", args["PYTHON_IMAGE"])
    assert [stage[0][1] for stage in _stages()] == ["${PYTHON_IMAGE} AS build", "${PYTHON_IMAGE}"]


def test_multi_stage_build() -> None:
    build, runtime = _stages()
    # The console extra (`timer-service console` runs from the image), at the pinned versions.
    assert any("pip install --constraint constraints.txt '.[console]'" in run for run in _args(build, "RUN"))
    assert not any("pip install" in run for run in _args(runtime, "RUN")), (
        "the runtime stage installs nothing"
    )
    assert any(copy.startswith("--from=build ") for copy in _args(runtime, "COPY"))


def test_runs_as_the_charts_non_root_user(chart_values: dict[str, Any]) -> None:
    runtime = _stages()[-1]
    user = _args(runtime, "USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "numeric non-root USER, so runAsNonRoot can check it"
    assert int(uid) == chart_values["podSecurityContext"]["runAsUser"]
    assert int(gid) == chart_values["podSecurityContext"]["runAsGroup"]


def test_entrypoint_healthcheck_and_port(chart_values: dict[str, Any]) -> None:
    runtime = _stages()[-1]
    # Exec form: timer-service is PID 1 and gets SIGTERM itself.
    assert json.loads(_args(runtime, "ENTRYPOINT")[-1]) == ["timer-service"]
    cmd = json.loads(_args(runtime, "CMD")[-1])
    assert cmd == ["run"]
    build_parser().parse_args(cmd)
    health = _args(runtime, "HEALTHCHECK")[-1]
    assert "/healthz" in health and "urllib" in health
    assert _args(runtime, "EXPOSE") == [str(chart_values["config"]["httpPort"])]


def test_dockerignore_keeps_what_the_build_copies() -> None:
    lines = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()]
    patterns = [ln for ln in lines if ln and not ln.startswith("#")]
    assert patterns[0] == "*", "allow-list: nothing enters the context unless named"
    allowed = {p.removeprefix("!").rstrip("/") for p in patterns if p.startswith("!")}
    assert "tools" not in allowed, "the benchmarks (tools/) stay out of the image"
    build = _stages()[0]
    for copy in _args(build, "COPY"):
        for source in copy.split()[:-1]:
            assert source.rstrip("/") in allowed, f"COPY {source} is excluded by .dockerignore"
            assert (ROOT / source).exists()


def test_constraints_pin_every_runtime_dependency() -> None:
    """constraints.txt pins each dependency the image installs (the package's and the console
    extra's), at a version pyproject.toml allows: an unpinned one would float between builds."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [
        Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["console"]]
    ]
    pins: dict[str, Version] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not pinned with ==: {line}"
            pins[_canonical(name)] = Version(version)
    for req in wanted:
        pin = pins.get(_canonical(req.name))
        assert pin is not None, f"{req.name} is not in constraints.txt"
        assert req.specifier.contains(pin, prereleases=True), f"{req.name}=={pin} outside {req.specifier}"
    assert "timer-service" not in pins  # the package itself is built from the source, never pinned


def test_oci_labels() -> None:
    runtime = _stages()[-1]
    labels = dict(
        re.findall(r'(org\.opencontainers\.image\.\w+)="([^"]*)"', " ".join(_args(runtime, "LABEL")))
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert labels["org.opencontainers.image.title"] == project["name"]
    assert labels["org.opencontainers.image.description"] == project["description"]
    assert labels["org.opencontainers.image.licenses"] == project["license"]
    assert labels["org.opencontainers.image.source"] == project["urls"]["Source"]
    # The version comes from a build arg whose default is the package's version.
    assert labels["org.opencontainers.image.version"] == "${VERSION}"
    assert f"VERSION={project['version']}" in _args(runtime, "ARG")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()
