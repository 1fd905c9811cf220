"""tools/bench/indexcost.py says bad input in one line, before it starts any server."""

from __future__ import annotations

import pytest

from tools.bench import indexcost


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--batches", "-1"]])
def test_bad_input_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert indexcost.main(argv) == 2
    err = capsys.readouterr().err
    assert err == "python -m tools.bench.indexcost: --rounds and --batches must be at least 1\n"
