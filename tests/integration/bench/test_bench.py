"""The benchmarks (tools/bench) work end to end at tiny sizes, through `timer-service bench`; speed
lives in docs/BENCHMARKS.md, not here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.integration.bench import ROOT, run_json


@pytest.mark.parametrize(
    ("module", "usage"),
    [
        ("tools.bench", "usage: python -m tools.bench "),  # `make bench`
        ("tools.bench.peers", "usage: python -m tools.bench.peers "),  # `make bench-peers`
        ("tools.bench.micro", "usage: python -m tools.bench.micro "),  # docs/BENCHMARKS.md
        ("tools.bench.indexcost", "usage: python -m tools.bench.indexcost "),  # docs/BENCHMARKS.md
        ("tools.bench.claimcost", "usage: python -m tools.bench.claimcost "),  # docs/BENCHMARKS.md
        ("tools.bench.consumer", "usage: python -m tools.bench.consumer "),  # docs/BENCHMARKS.md
        ("tools.bench.startup", "usage: python -m tools.bench.startup "),  # docs/BENCHMARKS.md
        ("tools.bench.tenantwork", "usage: python -m tools.bench.tenantwork "),  # docs/BENCHMARKS.md
    ],
)
def test_the_documented_entry_points_run_from_the_repository_root(module: str, usage: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert out.returncode == 0 and out.stdout.startswith(usage), out.stderr


def test_bench_runs_its_scenarios_and_checks_what_it_measures(pg_server_url: str, nats_url: str) -> None:
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    argv = ["drain", "intake", "intake-quota", "intake-tenants", "catchup", "producer", "capacity"]
    argv += ["--scale", "0.01", "--runs", "1", "--json"]
    report, stderr = run_json(["-m", "worker", "bench", *argv], env)
    assert report["command"] == "timer-service bench " + " ".join(argv)
    # the machine's yardstick before and after, beside the figures
    assert [set(c) >= {"cpu_loop_ms", "fsync_4k_ms_p50"} for c in report["calibration"]] == [True, True]
    results = report["results"]
    drain = results["drain"]["median"]
    assert drain["timers"] == 10_000 and drain["left_scheduled"] == 0 and drain["fires_per_s"] > 0
    assert results["intake"]["median"]["missing"] == 0
    quota = results["intake-quota"]["median"]  # the quota on and off, beside a table of timers
    assert (quota["table_rows"], quota["commands"]) == (50_000, 2_000) and quota["quota_on_over_off"] > 0
    tenants = results["intake-tenants"]["median"]  # a backlog over 5,000 tenants and over 10
    assert tenants["commands"] == 5_000 and tenants["many_over_few"] > 0
    catchup = results["catchup"]["median"]
    assert catchup["early"] == 0 and catchup["fresh_lateness_max_ms"] >= catchup["fresh_lateness_p50_ms"] >= 0
    assert {v["metric"] for v in results["catchup"]["targets"]} == {"fresh_lateness_p99_ms"}
    producer = results["producer"]["median"]
    # --scale honoured (200,000 x 0.01; the naive producer at its floor), every command stored
    assert (producer["commands"], producer["naive_commands"]) == (2_000, 200)
    assert producer["not_accepted"] == 0 and producer["stored_missing"] == 0
    assert producer["fast_commands"] == 2_000 and producer["fast_commands_per_s"] > 0
    assert producer["fast_over_auto"] == producer["fast_commands_per_s"] / producer["commands_per_s"]
    assert producer["commands_per_s"] > 0 and producer["naive_commands_per_s"] > 0
    assert producer["many_over_naive"] == producer["commands_per_s"] / producer["naive_commands_per_s"]
    assert [v["metric"] for v in results["producer"]["targets"]] == ["commands_per_s"]
    capacity = results["capacity"]["median"]  # per stored, fired and vacuumed timer
    assert capacity["timers"] == 1_000 and capacity["timers_bytes"] > 0
    assert capacity["intake_wal_bytes"] > 0 and capacity["fire_wal_bytes"] > 0 and capacity["fire_per_s"] > 0
    assert "[drain 1/1]" in stderr  # progress goes to stderr, results alone to stdout


def test_the_startup_bench_times_replicas_to_their_first_firing(pg_server_url: str, nats_url: str) -> None:
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # as here and in the image: only the bench writes .pyc
    compiled = ROOT / "worker" / "__pycache__" / f"service.{sys.implementation.cache_tag}.pyc"
    compiled.unlink(missing_ok=True)
    report, stderr = run_json(["-m", "tools.bench.startup", "--runs", "2", "--replicas", "2", "--json"], env)
    assert len(report["runs"]) == 2 and "[startup 2/2]" in stderr
    m = report["median"]
    # replica_started is logged before the first claim; its millisecond stamp may round past it
    assert 0 < m["started_s"] <= m["first_fire_s"] + 0.001 and m["cpu_s"] > 0
    assert compiled.is_file(), "the package was not byte-compiled before the replicas started"
    report, _ = run_json(["-m", "tools.bench.startup", "--connect", "--runs", "2", "--json"], env)
    assert [set(r) for r in report["runs"]] == [{"connect_s"}] * 2 and report["median"]["connect_s"] > 0


def test_indexcost_applies_the_same_commands_with_and_without_the_index(
    pg_server_url: str, nats_url: str
) -> None:
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    report, stderr = run_json(
        ["-m", "tools.bench.indexcost", "--rounds", "2", "--batches", "1", "--json"], env
    )
    assert [len(r) for r in report["rounds"].values()] == [2, 2]
    kinds = {
        "insert_ms",
        "insert_cpu_ms",
        "insert_wal_kb",
        "reschedule_ms",
        "reschedule_cpu_ms",
        "reschedule_wal_kb",
    }
    assert set(report["with_over_without"]) == kinds
    with_, without = report["median"]["with_index"], report["median"]["without_index"]
    assert all(with_[k] > 0 and without[k] > 0 for k in ("insert_wal_kb", "reschedule_wal_kb"))
    # The index is the one difference, and the runs wrote into it: more than its metapage (8 KiB).
    assert report["index_kb"]["with_index"] > 8 and report["index_kb"]["without_index"] is None
    assert "[indexcost 2/2]" in stderr


def test_claimcost_explains_claims_on_each_shape_with_and_without_an_index(
    pg_server_url: str, nats_url: str
) -> None:
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    argv = ["--shapes", "scattered", "fresh", "--without", "timers_pkey", "--big", "3000", "--due", "300"]
    report, stderr = run_json(
        ["-m", "tools.bench.claimcost", *argv, "--claims", "2", "--limit", "100", "--rounds", "1", "--json"],
        env,
    )
    median = report["median"]
    assert set(median) == {"scattered", "fresh"} and report["due_pages"]["scattered"] > 0
    for shape, by in median.items():
        assert set(by) == {"as migrated", "without timers_pkey"}, shape
        for variant, cost in by.items():
            assert cost["claimed"] == 100, (shape, variant)  # each claim took its limit
            assert 0 <= cost["before_first_due_ms"] <= cost["index_scan_ms"] < cost["claim_ms"], (
                shape,
                variant,
            )
            assert cost["update_ms"] > 0 and cost["wal_kb"] > 0, (shape, variant)
        # the variant lacks the index: no entry of it written per claimed row
        entries = by["as migrated"]["wal_records"] - by["without timers_pkey"]["wal_records"]
        assert entries >= 900, (shape, entries)
    assert "[claimcost 1/1] scattered, without timers_pkey:" in stderr


def test_the_consumer_bench_has_each_reader_read_every_event() -> None:
    argv = ["--rounds", "2", "--events", "600"]
    report, _ = run_json(["-m", "tools.bench.consumer", *argv], timeout=300)
    readers = ["due_events", "ordered", "push", "fetch"]
    # a reader returns only once it has read all 600 (else the run times out and exits non-zero)
    assert report["command"] == "python -m tools.bench.consumer " + " ".join(argv)
    assert [len(report["cpu_ms_per_1k_runs"][r]) for r in readers] == [2, 2, 2, 2]
    assert report["cpu_over_ordered"]["ordered"] == 1.0 and len(report["cpu_loop_ms"]) == 2
    assert all(report["events_per_s"][r] > 0 for r in readers)


def test_the_tenantwork_bench_times_each_costly_schedule_at_intake_and_to_fire() -> None:
    from tools.bench.tenantwork import CASES

    report, _ = run_json(["-m", "tools.bench.tenantwork", "--repeat", "1", "--json"])
    for case in CASES:
        assert report[f"{case}_intake_us"] > 0 and report[f"{case}_next_us"] > 0
    assert report["worst_next_us"] == max(report[f"{case}_next_us"] for case in CASES)
