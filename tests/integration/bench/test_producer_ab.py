"""The producer A/B (tools/bench/producer_ab.py) runs both clients on a real nats-server."""

from __future__ import annotations

import json
import subprocess

import pytest

from tools.bench import producer_ab
from tools.bench.report import ROOT


def test_it_compares_this_client_with_one_at_a_revision(capsys: pytest.CaptureFixture[str]) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    rev = head.stdout.strip()
    assert producer_ab.main(["--against", rev, "--rounds", "2", "--commands", "2500"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["rounds"], report["commands"]) == (2, 2500)
    assert (report["fast_ingest"], report["nats_sync"]) == ("on", "default")
    for version in ("this", rev):
        # one_round raises unless every command was accepted: the rates are of stored commands
        assert report[f"commands_per_s@{version}"] > 0
        assert report[f"client_us@{version}"] > 0 and report[f"server_us@{version}"] >= 0
    assert report[f"client_us_this/{rev}"] == round(report["client_us@this"] / report[f"client_us@{rev}"], 3)
    assert len(report["cpu_loop_ms"]) == 2 and len(report["load_average"]) == 3
