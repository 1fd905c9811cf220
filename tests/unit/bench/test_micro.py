"""The micro-benchmark of the firing path (tools/bench/micro.py) runs and says bad input in one line."""

from __future__ import annotations

import json

import pytest

import worker.contract
from tools.bench import micro


def test_it_times_both_cases_per_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert micro.main(["--calls", "2000", "--repeat", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["calls_per_round"], report["rounds"]) == (2000, 2)
    assert report["firing_id_ns@this"] > 0 and report["due_event_ns@this"] > 0
    assert report["publish_ns@nats-py"] > 0 and report["publish_ns@publish_all"] > 0
    ratio = report["publish_ns@publish_all"] / report["publish_ns@nats-py"]
    assert report["publish_publish_all/nats-py"] == round(ratio, 3)
    assert len(report["cpu_loop_ms"]) == 2  # the machine's speed before and after, beside the figures


def test_the_batch_is_a_drain_s_distinct_occurrences() -> None:
    batch = micro.occurrences()
    assert len({c.service_call_id for c in batch}) == len({c.due_at for c in batch}) == micro.BATCH
    events = micro.cases(worker.contract)["due_event"]()
    assert isinstance(events, list) and len(events) == micro.BATCH


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--calls", "0"], "--calls and --repeat must be at least 1"),
        (["--against", "no-such-revision-h21"], "no worker/contract.py at 'no-such-revision-h21'"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert micro.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m tools.bench.micro: {message}") and err.count("\n") == 1, err
