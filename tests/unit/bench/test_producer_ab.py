"""The producer A/B (tools/bench/producer_ab.py) says bad input in one line, before starting a server."""

from __future__ import annotations

import sys

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


def test_the_older_client_gets_the_older_wire_code_and_envelopes() -> None:
    """The batches' wire code is in natsconn.py, the envelopes in envelopes.py: with this tree's,
    the A/B would compare them with themselves."""
    import worker.envelopes
    import worker.natsconn

    older = producer_ab.client_at("HEAD")
    assert older.FastBatches is not worker.natsconn.FastBatches
    assert older.FastBatches.__module__ == "_natsconn_at_HEAD"
    assert older.Envelopes.__module__ == "_envelopes_at_HEAD"
    assert sys.modules["worker.natsconn"] is worker.natsconn  # this tree's again for everyone else
    assert sys.modules["worker.envelopes"] is worker.envelopes


def test_a_revision_before_the_envelopes_module_keeps_this_trees_modules() -> None:
    import worker.envelopes

    older = producer_ab.client_at("289a937")  # main before worker/envelopes.py
    assert older._command.__module__ == "_client_at_289a937"
    assert sys.modules["worker.envelopes"] is worker.envelopes
