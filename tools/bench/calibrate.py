"""How fast this machine was when the figures beside it were measured.

Benchmark figures move between hosts and between moments on one host (a shared or throttled
machine); without a yardstick measured at the same time a reader cannot tell a slower service
from a slower machine. Two probes, each a few seconds at most: a fixed CPU-bound loop (the
replicas, Postgres and NATS are CPU-bound in a drain) and fsyncs of a small write (what every
commit and every synced JetStream write waits for).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

CPU_LOOP_N = 2_000_000  # about 100-200 ms of one core for CPython 3.11 on a current server core
CPU_LOOP_RUNS = 5
FSYNC_WRITES = 50
FSYNC_BYTES = 4096


def _cpu_loop(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc


def cpu_loop_ms(n: int = CPU_LOOP_N, runs: int = CPU_LOOP_RUNS) -> float:
    """Median wall time of a fixed pure-Python loop: single-core speed, and how much of it we get."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        _cpu_loop(n)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def fsync_ms(directory: Path, writes: int = FSYNC_WRITES) -> tuple[float, float]:
    """Median and 90th percentile of (write 4 KiB at the file's end + fsync) in `directory`, in ms."""
    block = os.urandom(FSYNC_BYTES)
    times = []
    fd, path = tempfile.mkstemp(prefix="fsync-probe-", dir=directory)
    try:
        for _ in range(writes):
            started = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def calibrate(directory: Path) -> dict[str, Any]:
    """The machine's yardstick now: record it beside every figure measured on it.

    `directory` should be on the disk the servers write to (the fsync probe measures that disk).
    """
    median, p90 = fsync_ms(directory)
    return {
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_loop_ms": round(cpu_loop_ms(), 1),
        "fsync_4k_ms_p50": round(median, 3),
        "fsync_4k_ms_p90": round(p90, 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


PROBE_LOOP_N = CPU_LOOP_N // 10  # a tenth of the calibration's loop: 10-25 ms, once a second


def probe(every_s: float = 1.0, n: int = PROBE_LOOP_N) -> None:
    """The calibration's loop, small, once every `every_s` until killed: one line per run, the
    epoch time and the loop's milliseconds, for a long benchmark (the soak) to set beside each
    moment. Run in its own process (python -c 'from tools.bench.calibrate import probe; probe()'):
    in the benchmark's process it would stall the consumer whose receive times it measures."""
    while True:
        started = time.perf_counter()
        _cpu_loop(n)
        print(f"{time.time():.3f} {(time.perf_counter() - started) * 1000:.2f}", flush=True)
        time.sleep(max(0.0, every_s - (time.perf_counter() - started)))


def describe(cal: dict[str, Any]) -> str:
    """One line for a report."""
    return (
        f"calibration {cal['at']}: cpu loop {cal['cpu_loop_ms']:.0f} ms, "
        f"fsync 4 KiB p50 {cal['fsync_4k_ms_p50']:.2f} ms / p90 {cal['fsync_4k_ms_p90']:.2f} ms, "
        f"load {cal['load_avg_1m']:.2f}"
    )


def on_servers(
    prog: str,
    argv: list[str] | None,
    run: Callable[[str, str, Path], Coroutine[Any, Any, dict[str, Any]]],
    as_json: bool,
) -> dict[str, Any] | int:
    """`run(db_url, nats_url, workdir)` on the embedded servers (or TIMER_DATABASE_URL and
    TIMER_NATS_URL), between two calibrations: its report, with the command line and the
    calibrations, whose head (report_head) is printed; or the exit status when nothing more is to
    be printed: 0, the report printed as JSON; 2, the servers could not be had (why, on stderr)."""
    from worker.devkit.dev import servers  # not loaded for a bench that needs none
    from worker.errors import ConfigError
    from worker.logs import redact

    try:
        with (
            tempfile.TemporaryDirectory(prefix=f"timer-{prog.rsplit('.', 1)[-1]}-") as tmp,
            servers(Path(tmp), sync_always=False) as (db_url, nats_url),
        ):
            calibration = [calibrate(Path(tmp))]
            result = asyncio.run(run(db_url, nats_url, Path(tmp)))
            calibration.append(calibrate(Path(tmp)))
    except ConfigError as exc:
        print(f"{prog}: {redact(str(exc))}", file=sys.stderr)
        return 2
    command = " ".join([prog, *(argv if argv is not None else sys.argv[1:])])
    report = {"command": command, "calibration": calibration} | result
    return 0 if report_head(report, as_json) else report


def report_head(report: dict[str, Any], as_json: bool) -> bool:
    """The whole report as JSON (True: nothing more to print), or its command line and its
    calibrations, the head of a table to follow (False)."""
    if as_json:
        print(json.dumps(report, indent=2))
        return True
    print(report["command"])
    for calibration in report["calibration"]:
        print(describe(calibration))
    return False
