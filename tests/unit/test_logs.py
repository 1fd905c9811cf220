"""worker/logs.py: logs.Throttled, a warning that can come once per message, written at most once an
interval; and the loggers' names, each its module's."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest

from worker.logs import Throttled


def test_a_throttled_warning_is_written_once_an_interval_with_what_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="test.throttled")
    now = 100.0
    line = Throttled(logging.getLogger("test.throttled"), every_s=10.0, now=lambda: now)
    for _ in range(1000):
        line.warning("get failed", {"action": "get_failed"})
    now += 9.9
    line.warning("get failed", {"action": "get_failed"})
    now += 0.1
    line.warning("get failed", {"action": "get_failed", "error": "later"})
    line.warning("get failed", {"action": "get_failed"})
    now += 10.0
    line.warning("get failed", {"action": "get_failed"})
    written = [(r.__dict__.get("suppressed"), r.__dict__.get("error")) for r in caplog.records]
    assert written == [(None, None), (1000, "later"), (1, None)]


WORKER = Path(__file__).resolve().parents[2] / "worker"


def named_by_hand(root: Path = WORKER) -> list[str]:
    """Every getLogger("worker...") in the package: a name a reader cannot trace to its module."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "getLogger"
                and node.args
                and isinstance(name := node.args[0], ast.Constant)
                and str(name.value).split(".")[0] == root.name
            ):
                out.append(f"{path.relative_to(root.parent)}:{node.lineno} getLogger({name.value!r})")
    return out


def test_every_logger_of_the_service_is_named_after_its_module() -> None:
    """The JSON line's `logger` is the module that wrote it (getLogger(__name__)): "worker.broker"
    stood for four modules. Operators filter on `action` (docs/OPERATIONS.md, Logs)."""
    assert named_by_hand() == []


def test_a_logger_named_by_hand_is_found(tmp_path: Path) -> None:
    root = tmp_path / "worker"
    root.mkdir()
    (root / "a.py").write_text('import logging\nlog = logging.getLogger("worker.firing")\n')
    (root / "b.py").write_text('from logging import getLogger\nlog = getLogger("worker")\n')
    (root / "c.py").write_text(
        'import logging\nlog = logging.getLogger(__name__)\nn = logging.getLogger("nats")\n'
    )
    assert named_by_hand(root) == [
        "worker/a.py:2 getLogger('worker.firing')",
        "worker/b.py:2 getLogger('worker')",
    ]
