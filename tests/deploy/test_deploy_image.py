"""The Dockerfile and .dockerignore, read instruction by instruction (no Docker engine here)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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
    assert any("pip install ." in run for run in _args(build, "RUN"))
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
