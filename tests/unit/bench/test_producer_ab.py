"""The producer A/B (tools/bench/producer_ab.py) says bad input in one line, before starting a server."""

from __future__ import annotations

import sys

import pytest

from tools.bench import producer_ab


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--against", "main", "--rounds", "0"], "--rounds and --commands must be at least 1"),
        (
            ["--against", "no-such-revision-h21"],
            "no worker/client/producer.py or worker/client.py at 'no-such-revision-h21'",
        ),
    ],
)
def test_bad_input_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert producer_ab.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m tools.bench.producer_ab: {message}") and err.count("\n") == 1, err


def test_the_older_client_gets_the_older_wire_code_and_envelopes() -> None:
    """The batches' wire code is in worker/client/{wire,batches}.py, the envelopes in envelopes.py:
    with this tree's, the A/B would compare them with themselves."""
    import worker.client.batches
    import worker.client.envelopes
    import worker.client.wire

    older = producer_ab.client_at("HEAD")
    assert older.FastBatches is not worker.client.batches.FastBatches
    assert older.FastBatches.__module__ == "_batches_at_HEAD"
    assert older.Envelopes.__module__ == "_envelopes_at_HEAD"
    assert older.written.__module__ == "_wire_at_HEAD"
    # this tree's again for everyone else
    assert sys.modules["worker.client.batches"] is worker.client.batches
    assert sys.modules["worker.client.wire"] is worker.client.wire
    assert sys.modules["worker.client.envelopes"] is worker.client.envelopes


def test_a_client_of_the_flat_layout_brings_its_own_modules() -> None:
    """Before worker/client/ the client was worker/client.py beside natsconn.py, envelopes.py and
    consumer.py, none of which this tree has: they come from the revision, and go again."""
    older = producer_ab.client_at("bd96b6c")  # main before worker/client/
    assert older.FastBatches.__module__ == "_natsconn_at_bd96b6c"
    assert older.Envelopes.__module__ == "_envelopes_at_bd96b6c"
    assert older.due_events.__module__ == "_consumer_at_bd96b6c"
    assert not {"worker.natsconn", "worker.envelopes", "worker.consumer"} & set(sys.modules)


def test_a_revision_before_the_envelopes_module_keeps_this_trees_modules() -> None:
    older = producer_ab.client_at("289a937")  # main before worker/envelopes.py
    assert older._command.__module__ == "_client_at_289a937"
    assert older.FastBatches.__module__ == "_natsconn_at_289a937"
