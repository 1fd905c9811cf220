"""tools/bench/shapes.py (`drain-shapes`) end to end at a tiny size, through `python -m tools.bench`."""

from __future__ import annotations

import os

from tests.integration.bench import run_json


def test_drain_shapes_drains_every_table_shape(pg_server_url: str, nats_url: str) -> None:
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    argv = ["drain-shapes", "--scale", "0.01", "--runs", "1", "--replicas", "1", "--json"]
    report, stderr = run_json(["-m", "tools.bench", *argv], env)
    m = report["results"]["drain-shapes"]["median"]
    # --scale honoured (50,000 due at its floor of 1,000; 5,000,000 x 0.01), every due timer fired
    # and recorded on each shape, with its rate, the WAL it took and the pages the due rows sat on
    assert (m["timers"], m["big_rows"]) == (1_000, 50_000)
    for shape in ("fresh", "burst", "scattered", "churned"):
        assert m[f"{shape}_fires_per_s"] > 0 and m[f"{shape}_wal_bytes_per_fire"] > 0, shape
        assert m[f"{shape}_left_scheduled"] == 0, shape
        assert 0 < m[f"{shape}_due_pages"] <= 1_000, shape
    # scattered: one due timer every 51 rows, each on a page of its own; the burst appended
    # packed; after the churn the burst lands in the slots retention freed, page after page
    assert m["scattered_due_pages"] == 1_000
    assert m["burst_due_pages"] < 100
    assert m["churned_due_pages"] >= 900  # 1,000 slots freed, one every 50 rows: one due row each
    assert m["burst_over_fresh"] == m["burst_fires_per_s"] / m["fresh_fires_per_s"]
    assert m["scattered_over_fresh"] == m["scattered_fires_per_s"] / m["fresh_fires_per_s"]
    assert m["churned_over_fresh"] == m["churned_fires_per_s"] / m["fresh_fires_per_s"]
    assert [v["metric"] for v in report["results"]["drain-shapes"]["targets"]] == ["burst_over_fresh"]
    assert "burst: building 1,000 due among 50,000" in stderr
