"""The producer A/B (tools/bench/producer_ab.py) says bad input in one line, before starting a server."""

from __future__ import annotations

import pytest

from tools.bench import producer_ab


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--against", "main", "--rounds", "0"], "--rounds and --commands must be at least 1"),
        (["--against", "no-such-revision-h21"], "no worker/client.py at 'no-such-revision-h21'"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert producer_ab.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m tools.bench.producer_ab: {message}") and err.count("\n") == 1, err
