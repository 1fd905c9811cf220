"""tools/bench/soak.py: end to end at a tiny size (`python -m tools.bench soak`), and against a real
Postgres the autovacuum setting it compares."""

from __future__ import annotations

import math
import os
from pathlib import Path

from tests.helpers import query
from tests.integration.bench import run_json
from tools.bench.rig import Rig
from tools.bench.soak import _vacuum_cost_delay

RELOPTIONS_SQL = "SELECT reloptions FROM pg_class WHERE oid = 'timers'::regclass"


async def test_the_soak_sets_the_tables_vacuum_cost_delay_only_when_asked(
    pg_server_url: str, nats_url: str, tmp_path: Path
) -> None:
    said: list[str] = []
    async with Rig(pg_server_url, nats_url, tmp_path) as rig:
        # not asked: the migrations' own (0018_gentler_autovacuum.sql), left as it is
        assert await _vacuum_cost_delay(rig, None, said.append) == 5.0
        assert "autovacuum_vacuum_cost_delay=5" in query(rig.db_url, RELOPTIONS_SQL)[0][0]
        assert await _vacuum_cost_delay(rig, 2.5, said.append) == 2.5
        options = query(rig.db_url, RELOPTIONS_SQL)[0][0]
        assert "autovacuum_vacuum_cost_delay=2.5" in options
        assert "autovacuum_vacuum_scale_factor=0.01" in options  # the others kept
        await rig.db_.execute("ALTER TABLE timers RESET (autovacuum_vacuum_cost_delay)")
        assert math.isnan(await _vacuum_cost_delay(rig, None, said.append))  # the server's applies
    assert said == [
        "autovacuum_vacuum_cost_delay of timers: 5 ms (as the migrations left it)",
        "autovacuum_vacuum_cost_delay of timers: 2.5 ms (set by --vacuum-cost-delay-ms)",
        "autovacuum_vacuum_cost_delay of timers: the server's (none of the table's own)",
    ]


def test_the_soak_bench_checks_every_timer_and_prints_its_windows(pg_server_url: str, nats_url: str) -> None:
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    argv = [
        "soak",
        "--scale",
        "0.002",
        "--runs",
        "1",
        "--replicas",
        "1",
        "--vacuum-cost-delay-ms",
        "2",
        "--soak-rate",
        "300",
        "--json",
    ]
    report, stderr = run_json(["-m", "tools.bench", *argv], env)
    m = report["results"]["soak"]["median"]
    # the autovacuum to compare, on the soak's table before the load (the migrations set 5)
    # as the table held it then, read back from pg_class, and said with the progress
    assert m["vacuum_cost_delay_ms"] == 2.0
    assert "autovacuum_vacuum_cost_delay of timers: 2 ms (set by --vacuum-cost-delay-ms)" in stderr
    # --scale honoured (5,000,000 rows and 900 s x 0.002, at their floors of 10,000 and 20 s in
    # windows of 5 s), the producers kept --soak-rate and a tenth of it cancelled, and every timer
    # is accounted for
    assert (m["rows"], m["seconds"], m["windows"], m["rate"]) == (10_000, 20, 4, 300)
    assert 5_400 <= m["scheduled"] <= 6_000 and 540 <= m["cancelled"] <= 600
    assert m["fired"] == m["scheduled"] - m["cancelled"] - m["send_errors"]
    assert (m["lost"], m["cancelled_fired"], m["early"]) == (0, 0, 0)
    assert 0 < m["lateness_p50_ms"] <= m["max_window_p99_ms"] <= m["lateness_max_ms"]
    assert m["rss_max_mb"] > 0 and m["wal_mb"] > 0 and m["cpu_loop_ms_max"] > 0
    targets = [v["metric"] for v in report["results"]["soak"]["targets"]]
    assert targets == ["max_window_p99_ms", "lost", "cancelled_fired"]
    # the window table, one row a window (and the drain's after it), went out with the progress
    header = next(line for line in stderr.splitlines() if "| t (s) | fires |" in line)
    rows = stderr[stderr.index(header) :].splitlines()[2:6]
    assert [r.split(" | ")[1] for r in rows] == ["0", "5", "10", "15"]  # "[soak 1/1] | 0 | ..."
    assert "slow seconds" in stderr
