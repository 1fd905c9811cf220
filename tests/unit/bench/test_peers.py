"""The pure parts of `make bench-peers`, of the machine calibration and of the reports' command line;
the runs themselves are in BENCHMARKS.md."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tools.bench import MODULE_PROG
from tools.bench.peer_systems import Measured
from tools.bench.peers import cpu_ms_per_1k, drain_rate, lateness_ms, main, pg_setting, summarize, table
from tools.bench.report import calibrate, describe, invocation
from tools.bench.rig import tree_cpu_s


def test_drain_rate_counts_from_the_first_receive_to_the_last() -> None:
    # 1,001 receives over 2 s: 1,000 intervals, 500/s, whatever came before the first receive
    receipts = [(0.0, 100.0 + i * 0.002) for i in range(1001)]
    assert math.isclose(drain_rate(receipts), 500.0)
    assert math.isnan(drain_rate([(0.0, 1.0)]))  # one receive has no span


def test_lateness_is_receive_minus_due_in_ms() -> None:
    receipts = [(10.0, 10.0 + i / 1000) for i in range(1, 101)]  # 1 .. 100 ms late
    late = lateness_ms(receipts)
    assert math.isclose(late["max_ms"], 100.0, abs_tol=1e-6)
    assert 49 <= late["p50_ms"] <= 52 and 98 <= late["p99_ms"] <= 100


def test_cpu_per_thousand_fires_by_component_and_in_total() -> None:
    m = Measured([], {"postgres": 1.0, "nats": 0.5, "workers": 2.0, "consumer": 0.5}, fires_in_window=10_000)
    assert cpu_ms_per_1k(m) == {
        "postgres": 100.0,
        "nats": 50.0,
        "workers": 200.0,
        "consumer": 50.0,
        "total": 400.0,
    }


def _run(rates: dict[str, float], cpu_total: float, p99: float, pages: float = math.nan) -> dict[str, Any]:
    drain = {
        "cpu_ms_per_1k": {"postgres": cpu_total, "total": cpu_total},
        "wal_bytes_per_fire": 500.0,
        "due_pages": pages,
    }
    return {
        "drain": {shape: {"fires_per_s": rate, **drain} for shape, rate in rates.items()},
        "lateness": {"p50_ms": 1.0, "p99_ms": p99, "max_ms": 2 * p99},
    }


def test_summary_takes_medians_and_divides_each_rate_by_graphile_workers_round_by_round() -> None:
    runs = {
        "timer-service": [
            _run({"fresh": 10_000, "burst": 5_000}, 60, 5, pages=280),
            _run({"fresh": 12_000, "burst": 6_000}, 50, 6, pages=300),
            _run({"fresh": 9_000, "burst": 4_000}, 70, 4, pages=290),
        ],
        "graphile-worker": [
            _run({"fresh": 20_000, "burst": 20_000}, 40, 1990),
            _run({"fresh": 24_000, "burst": 10_000}, 30, 2000),
            _run({"fresh": 22_000, "burst": 8_000}, 35, 1980),
        ],
        "nats-schedules": [_run({"fresh": 40_000}, 20, 100)] * 3,  # no table: fresh only, no pages
    }
    s = summarize(runs)
    ours, gw = s["timer-service"]["drain"], s["graphile-worker"]["drain"]
    assert (ours["fresh"]["fires_per_s"], ours["fresh"]["min"], ours["fresh"]["max"]) == (
        10_000,
        9_000,
        12_000,
    )
    # each round's rate over graphile-worker's in the same round, then their median
    assert ours["fresh"]["over_reference_rounds"] == [0.5, 0.5, 9_000 / 22_000]
    assert ours["fresh"]["over_reference"] == 0.5
    assert (
        ours["burst"]["over_reference_rounds"] == [0.25, 0.6, 0.5] and ours["burst"]["over_reference"] == 0.5
    )
    assert gw["fresh"]["over_reference"] == 1.0 and gw["fresh"]["cpu_ms_per_1k"]["total"] == 35
    assert s["graphile-worker"]["lateness"]["p99_ms"] == 1990
    assert set(s["nats-schedules"]["drain"]) == {"fresh"}

    report = {
        "command": "make bench-peers",
        "config": {
            "runs": 3,
            "drain_n": 50_000,
            "big": 1_000_000,
            "rate": 500,
            "seconds": 20.0,
            "replicas": 2,
        },
        "calibration": [
            {
                "at": "2026-11-23T12:00:00+0000",
                "cpu_loop_ms": 150.0,
                "fsync_4k_ms_p50": 0.3,
                "fsync_4k_ms_p90": 0.5,
                "load_avg_1m": 1.0,
            }
        ],
        "summary": s,
    }
    lines = table(report).splitlines()
    assert lines[1] == (
        "calibration 2026-11-23T12:00:00+0000: cpu loop 150 ms, "
        "fsync 4 KiB p50 0.30 ms / p90 0.50 ms, load 1.00"
    )
    ours_row = (
        "| timer-service | fresh | 10,000 | 9,000 .. 12,000 | 0.50, 0.50, 0.41 (**0.50**) "
        "| 60.0: 60.0 / 0.0 / 0.0 / 0.0 | 500 | 290 |"  # the median of the rounds' due pages
    )
    assert ours_row in lines
    assert "| timer-service | burst | 5,000 | 4,000 .. 6,000 | 0.25, 0.60, 0.50 (**0.50**) |" in "\n".join(
        lines
    )
    assert "| graphile-worker | 1.0 / 1,990 / 3,980 |" in lines
    nats = next(row for row in lines if row.startswith("| nats-schedules | fresh"))
    assert nats.endswith("| 500 | n/a |")  # no table, no pages


def test_calibration_measures_a_cpu_loop_and_fsyncs_on_the_given_disk(tmp_path: Path) -> None:
    cal = calibrate(tmp_path)
    assert set(cal) == {"at", "cpu_loop_ms", "fsync_4k_ms_p50", "fsync_4k_ms_p90", "load_avg_1m"}
    assert cal["cpu_loop_ms"] > 1 and 0 < cal["fsync_4k_ms_p50"] <= cal["fsync_4k_ms_p90"]
    assert list(tmp_path.iterdir()) == []  # the probe file is gone
    assert describe(cal).startswith(f"calibration {cal['at']}: cpu loop ")


def test_tree_cpu_counts_this_process() -> None:
    before = tree_cpu_s([os.getpid()])
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn 0.3 s of CPU
        pass
    assert tree_cpu_s([os.getpid()]) - before >= 0.25
    assert tree_cpu_s([]) == 0.0


def test_tree_cpu_keeps_a_child_that_has_exited() -> None:
    # A Postgres backend or a worker may exit within the window: its time moves to its parent's.
    before = tree_cpu_s([os.getpid()])
    burn = "import time\nt = time.process_time() + 0.3\nwhile time.process_time() < t: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)
    assert tree_cpu_s([os.getpid()]) - before >= 0.25


def test_a_report_names_the_command_as_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAKELEVEL", raising=False)
    for name in [k for k in os.environ if k.startswith("TIMER_")]:  # a setting would lead the command
        monkeypatch.delenv(name)
    assert invocation(MODULE_PROG, MODULE_PROG, "bench", ["drain", "--runs", "5"]) == (
        "python -m tools.bench drain --runs 5"
    )
    monkeypatch.setenv("MAKELEVEL", "1")  # `make bench ARGS=...` runs the module
    assert invocation(MODULE_PROG, MODULE_PROG, "bench", ["drain", "--runs", "5"]) == (
        "make bench ARGS='drain --runs 5'"
    )
    assert invocation(MODULE_PROG, MODULE_PROG, "bench", []) == "make bench"
    # `timer-service bench` inside something make started (`make test`) is still itself
    assert invocation("timer-service bench", MODULE_PROG, "bench", ["idle"]) == "timer-service bench idle"


def test_a_report_names_the_settings_its_replicas_inherit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MAKELEVEL", raising=False)
    for name in [k for k in os.environ if k.startswith("TIMER_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TIMER_EVENTS_FAST_INGEST", "on")
    monkeypatch.setenv("TIMER_DATABASE_URL", "postgresql://u:secret@db/timers")  # where, not how
    monkeypatch.setenv("TIMER_FLEET_SECRET", "s3cret")
    assert invocation(MODULE_PROG, MODULE_PROG, "bench", ["drain"]) == (
        "TIMER_EVENTS_FAST_INGEST=on python -m tools.bench drain"
    )


def test_a_postgres_setting_is_name_equals_value_and_a_bad_one_is_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert pg_setting("wal_compression=lz4") == ("wal_compression", "lz4")
    assert pg_setting("work_mem=64MB") == ("work_mem", "64MB")
    for bad in ("wal_compression", "=lz4", "wal compression=lz4", "x;DROP=1"):
        with pytest.raises(SystemExit) as exit_:
            main(["--pg-setting", bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert "argument --pg-setting" in err and "expected NAME=VALUE" in err and "Traceback" not in err
