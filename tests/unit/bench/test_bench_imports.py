"""The benchmarks import no circle either: the scenario list imports the modules holding
scenarios, and what they share (Context, Metrics, the measures) is in rig.py, below both."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_layout import cycles, read_package

TOOLS = Path(__file__).resolve().parents[3] / "tools"


def test_no_import_circle_among_the_benchmarks() -> None:
    modules = read_package(TOOLS)
    assert {"tools.bench.producer", "tools.bench.scenarios", "tools.bench.rig"} <= set(modules)
    assert cycles(modules) == []
