"""tools/bench/soak_report.py's reading of its samples: windows, and what each slow second went with."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from tools.bench.soak_report import (
    Sample,
    attribution,
    machine_waits_s,
    quiet_lateness,
    seconds_table,
    window_table,
    windows,
)

T0 = 1_800_000_000  # a whole second


def sample(at: float, **changed: Any) -> Sample:
    quiet: dict[str, Any] = {
        "table_bytes": 2**30,
        "index_bytes": 2**29,
        "live": 5_000_000,
        "dead": 1000,
        "deleted": 0,
        "autovacuums": 0,
        "autoanalyzes": 0,
        "wal_bytes": int(at - T0) * 2**20,  # 1 MiB a second
        "wal_file": "000000010000000000000001",
        "vacuum_phase": None,
        "checkpointer": "CheckpointerMain",
        "deleting": 0,
        "wal_fpi": 0,
        "analyze_phase": None,
        "longest": "2 ms UPDATE timers",
        "checkpoints": 0,
        "rss_mb": 53.0,
        "pg_cpu_s": at - T0,
        "replicas_cpu_s": 0.0,
        "load_1m": 2.0,
        "iowait_s": 0.0,
        "steal_s": 0.0,
    }
    return Sample(at=at, **(quiet | changed))


def test_a_slow_second_is_set_beside_what_went_on_in_it_and_the_second_before() -> None:
    samples = [sample(T0 + i + 0.5) for i in range(10)]
    # an autovacuum of `timers` runs in second 3 and ends in 4; retention deletes in second 8
    samples[3] = sample(T0 + 3.5, vacuum_phase="vacuuming indexes")
    samples[4] = sample(T0 + 4.5, autovacuums=1)
    for i in range(4, 10):
        samples[i].autovacuums = 1
    samples[8] = sample(T0 + 8.5, autovacuums=1, deleted=2000)
    samples[9].deleted = 2000
    # the hypervisor takes 0.3 of a core in second 7
    for i in range(7, 10):
        samples[i].steal_s = 0.3
    probe = [(T0 + i + 0.2, 15.0) for i in range(10)]
    seconds = seconds_table(samples, probe)
    assert [s["second"] for s in seconds] == list(range(T0 + 1, T0 + 10))
    assert [s["deleted"] for s in seconds] == [0] * 7 + [2000, 0]
    assert all(s["cpu_loop_ms"] == 15.0 and s["wal_mb"] == 1.0 for s in seconds)

    late = {T0 + 4: [3.0, 400.0], T0 + 6: [2.0, 80.0], T0 + 7: [5.0, 90.0], T0 + 9: [5.0]}
    lines, counts = attribution(seconds, late, target=50)
    # second 4: the vacuum that ran in 3 and ended in 4; second 6: nothing (5 and 6 were quiet)
    assert lines == [
        f"{_hms(T0 + 4)} max 400 ms (2 due): autovacuum (vacuuming indexes), autovacuum done;"
        " loop 15 ms, pg 1.00 cores, load 2.0",
        f"{_hms(T0 + 6)} max 80 ms (2 due): nothing sampled; loop 15 ms, pg 1.00 cores, load 2.0",
        f"{_hms(T0 + 7)} max 90 ms (2 due): steal (0.30 cores); loop 15 ms, pg 1.00 cores, load 2.0",
    ]
    # (slow seconds it went with, of 3; seconds it went with, of 9: itself or the one before)
    assert counts["autovacuum"] == (1, 2)  # seconds 3 and 4
    assert counts["autovacuum done"] == (1, 2)  # 4 and 5
    assert counts["retention delete"] == (0, 2)  # 8 and 9
    assert counts["steal"] == (1, 2)  # 7 and 8
    assert counts["nothing sampled"] == (1, 3)  # 1, 2 and 6


def test_windows_take_lateness_by_due_second_and_sum_what_their_seconds_saw() -> None:
    samples = [sample(T0 + i + 0.5) for i in range(21)]
    for i in range(12, 21):
        samples[i].checkpoints = 1  # one completed in second 12
    samples[11].checkpointer = "CheckpointWriteDelay"
    seconds = seconds_table(samples, [])
    late = {T0 + i: [float(i)] * 100 for i in range(20)}
    rows = windows(seconds, late, start=T0, width=10)
    assert [r["fires"] for r in rows] == [1000, 1000, 0]
    assert [r["max_ms"] for r in rows[:2]] == [9.0, 19.0]
    assert [(r["checkpoints"], r["checkpointer_s"]) for r in rows] == [(0, 0), (1, 1), (0, 0)]
    assert rows[0]["wal_mb"] == 9.0  # seconds 1 to 9: each of them the MiB since the one before
    table = window_table(rows)
    assert table[0].startswith("| t (s) | fires | p50 ms | p99 ms | max ms |") and len(table) == 5
    assert table[4].startswith("| 20 | 0 | - | - | - |")  # a window without fires says so


def test_the_quiet_seconds_are_those_the_calibration_loop_ran_fast_in_and_just_before() -> None:
    loops = [10.0] * 8 + [40.0] + [10.0] * 10 + [11.0]  # one busy second: 8
    seconds = [{"second": T0 + i, "cpu_loop_ms": ms} for i, ms in enumerate(loops)]
    late = {T0 + i: [1.0] * 99 + [float(100 + i)] for i in range(20)}
    # second 0 has none before it, 8 and 9 saw the busy loop, 19 is past the load's end: 16 left,
    # one late timer in each 100, the 1st percentile of them the first late one (second 1's)
    count, p99 = quiet_lateness(seconds, late, until=T0 + 19)
    assert (count, p99) == (16, 101.0)


def test_the_machines_waits_are_read_from_proc_stat_in_seconds(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    tick = os.sysconf("SC_CLK_TCK")
    stat.write_text(f"cpu  100 0 50 900 {3 * tick} 0 7 {tick // 2} 0 0\ncpu0 50 0 25 450 0 0 0 0 0 0\n")
    assert machine_waits_s(stat) == (3.0, 0.5)
    assert all(math.isnan(x) for x in machine_waits_s(tmp_path / "none"))


def _hms(second: int) -> str:
    import time

    return time.strftime("%H:%M:%S", time.gmtime(second))
