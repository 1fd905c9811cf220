"""Fixtures for the deployment files: the chart is linted and rendered by Helm's own library.

The tools (helm-python-sdk, PyYAML) live in their own venv, `.venv-helm`, made on first use from
deploy/requirements-helm.txt, so the service's venv stays as it is. helm_tool.py runs there and
answers in JSON. When this interpreter already has both (say they join the dev extra), it is used.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import tool_venv

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "timer-service"
TOOL = Path(__file__).with_name("helm_tool.py")
VENV = ROOT / ".venv-helm"
REQUIREMENTS = ROOT / "deploy" / "requirements-helm.txt"

Tool = Callable[[dict[str, Any]], dict[str, Any]]


def _tools_python() -> Path:
    """A Python with helm_python and yaml: this one, else .venv-helm (made or refreshed here)."""
    if importlib.util.find_spec("helm_python") and importlib.util.find_spec("yaml"):
        return Path(sys.executable)
    return tool_venv(VENV, REQUIREMENTS)


@pytest.fixture(scope="session")
def deploy_tool() -> Tool:
    """Call helm_tool.py with a request; returns its JSON answer."""
    python = _tools_python()

    def run(request: dict[str, Any]) -> dict[str, Any]:
        proc = subprocess.run(
            [str(python), str(TOOL)],
            input=json.dumps(request),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, f"helm_tool.py failed:\n{proc.stderr}"
        answer: dict[str, Any] = json.loads(proc.stdout)
        return answer

    return run
