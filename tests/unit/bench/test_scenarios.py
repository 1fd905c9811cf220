"""Which scenarios `timer-service bench` runs when none is named."""

from __future__ import annotations

from tools.bench import default_scenarios


def test_the_long_and_the_targetless_scenarios_run_only_when_named() -> None:
    chosen = default_scenarios()
    assert "steady" in chosen and "drain" in chosen
    assert "soak" not in chosen and "drain-shapes" not in chosen
    assert "burst" not in chosen and "burst-window" not in chosen  # the window's run lasts ten minutes
