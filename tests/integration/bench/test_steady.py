"""tools/bench/steady.py end to end at a tiny size, through `python -m tools.bench`."""

from __future__ import annotations

import os

from tests.integration.bench import run_json


def test_the_steady_bench_sets_the_realistic_tables_postgres_cpu_beside_the_empty_ones(
    pg_server_url: str, nats_url: str
) -> None:
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    argv = ["steady", "--scale", "0.002", "--runs", "1", "--replicas", "1", "--json"]
    report, stderr = run_json(["-m", "tools.bench", *argv], env)
    m = report["results"]["steady"]["median"]
    # --scale honoured (5,000,000 x 0.002), every timer of both arms fired and measured
    assert m["rows"] == 10_000 and m["due_per_s"] == 500
    assert m["empty_pg_cpu_us_per_fire"] > 0 and m["pg_cpu_us_per_fire"] > 0
    assert m["pg_cpu_over_empty"] == m["pg_cpu_us_per_fire"] / m["empty_pg_cpu_us_per_fire"]
    assert m["lateness_p99_ms"] >= 0 and m["empty_lateness_p99_ms"] >= 0
    assert [v["metric"] for v in report["results"]["steady"]["targets"]] == ["pg_cpu_over_empty"]
    assert "building a table of 10,000 pending timers" in stderr
