"""`make bench-peers` (tools/bench/peers.py) works end to end at a tiny size: every system on
every table shape, the peers installed as the harness installs them; speed lives in
docs/BENCHMARKS.md, not here."""

from __future__ import annotations

import math

from tests.integration.bench.test_bench import run_json
from tools.bench.shapes import CHURN_EVERY, SHAPES

# The peers' installs (npm, a pip venv), made on first use and kept, as .venv-helm is.
TOOLS = ".venv-peers"  # under the repository root
SYSTEMS = ["timer-service", "timer-service-push", "graphile-worker", "pgqueuer"]


def test_every_system_drains_every_table_shape_beside_graphile_worker() -> None:
    argv = ["--systems", *SYSTEMS, "--runs", "1", "--drain", "300", "--big", "3000", "--seconds", "0"]
    argv += ["--pg-setting", "wal_compression=pglz"]  # a server setting every system then runs with
    report, stderr = run_json(
        # --tools relative to the repository root, where run_json runs it
        ["-m", "tools.bench.peers", *argv, "--tools", TOOLS, "--json"],
        timeout=900,
    )
    assert report["config"]["shapes"] == list(SHAPES) and report["config"]["big"] == 3000
    assert set(report["versions"]) == {"graphile-worker", "node", "pgqueuer"}
    assert report["config"]["pg_settings"] == {"wal_compression": "pglz"}  # as the server says it
    for system in SYSTEMS:
        drains = report["summary"][system]["drain"]
        # every shape drained: all 300 received (else the run times out and exits non-zero),
        # each with its rate, its ratio to graphile-worker's in the round, CPU, WAL and the heap
        # pages its due jobs sat on
        assert list(drains) == ["fresh", "burst", "scattered", "churned"], system
        for shape, d in drains.items():
            assert d["fires_per_s"] > 0, (system, shape)
            # measured, whatever a drain this small leaves between its first and last receive
            assert set(d["cpu_ms_per_1k"]) >= {"postgres", "nats", "workers", "total"}, (system, shape)
            assert d["wal_bytes_per_fire"] >= 0, (system, shape)  # NaN when not measured
            graphile = report["summary"]["graphile-worker"]["drain"][shape]["fires_per_s"]
            assert math.isclose(d["over_reference"], d["fires_per_s"] / graphile), (system, shape)
            assert 0 < d["due_pages"] <= 300, (system, shape)  # counted in each system's own table
        if system.startswith("timer-service"):
            # the burst appended packed; after the churn it fills the slots retention freed, one
            # every CHURN_EVERY rows of the big table, each on a page of its own
            assert drains["burst"]["due_pages"] < 3000 // CHURN_EVERY <= drains["churned"]["due_pages"]
        assert all(math.isnan(v) for v in report["summary"][system]["lateness"].values())  # --seconds 0
    assert "timer-service-push: burst drain" in stderr and "graphile-worker: scattered drain" in stderr
    assert "pgqueuer: churned drain" in stderr
