"""`timer-service bench`'s arguments (tools/bench/__init__.py): a bad one is one line, before any
server starts."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import property_settings
from tools.bench import _cost_delay, add_arguments, main

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("given_ms", ["101", "-1", "two", "nan", "inf", ""])
def test_a_vacuum_cost_delay_postgres_would_refuse_is_one_line(
    given_ms: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["soak", "--vacuum-cost-delay-ms", given_ms])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --vacuum-cost-delay-ms: {given_ms!r} is not a number of milliseconds from 0 to 100" in err
    )
    assert "Traceback" not in err


@pytest.mark.parametrize("given_rate", ["0", "-5", "20001", "1.5", "many", ""])
def test_a_soak_rate_out_of_range_is_one_line(given_rate: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["soak", "--soak-rate", given_rate])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert (
        f"argument --soak-rate: {given_rate!r} is not a whole number of timers a second from 1 to 20,000"
        in err
    )
    assert "Traceback" not in err


@pytest.mark.parametrize(("flag", "value"), [("--vacuum-cost-delay-ms", "2"), ("--soak-rate", "1000")])
def test_a_soak_setting_without_the_soak_is_refused(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Every other scenario would run as if it were not given: said, not ignored
    assert main(["drain", flag, value]) == 2
    assert capsys.readouterr().err == f"{flag} applies to the soak only: name `soak` with it\n"


@property_settings(500)
@given(st.one_of(st.text(), st.floats(allow_nan=True, allow_infinity=True).map(str)))
def test_any_text_is_a_delay_postgres_takes_or_the_one_line_refusal(text: str) -> None:
    try:
        ms = _cost_delay(text)
    except argparse.ArgumentTypeError:
        return
    assert 0 <= ms <= 100


def test_the_documented_soak_commands_parse_as_written() -> None:
    # docs/BENCHMARKS.md's soak lines (the A/B of the autovacuum among them), up to a redirection
    lines = [
        line.split("timer-service bench ", 1)[1].split(">")[0].split("#")[0]
        for line in (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
        if "timer-service bench soak" in line and "`" not in line  # a command, not prose
    ]
    assert any("--vacuum-cost-delay-ms 2" in line for line in lines)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for line in lines:
        args = parser.parse_args(shlex.split(line))
        assert args.scenarios == ["soak"], line
