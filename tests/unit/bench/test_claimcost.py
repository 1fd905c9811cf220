"""tools/bench/claimcost.py says bad input in one line, before it starts any server."""

from __future__ import annotations

import pytest

from tools.bench import claimcost


@pytest.mark.parametrize("argv", [["--rounds", "0"], ["--claims", "0"], ["--due", "-1"]])
def test_bad_input_is_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert claimcost.main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "python -m tools.bench.claimcost: --big, --due, --claims, --limit and --rounds must be at least 1\n"
    )


def test_an_index_it_cannot_drop_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        claimcost.main(["--without", "timers_due"])  # the claim's own index: no claim without it
    assert exit_.value.code == 2
    assert "invalid choice: 'timers_due'" in capsys.readouterr().err
