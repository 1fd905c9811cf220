"""What one Postgres spends per stored and per fired timer: the inputs of docs/OPERATIONS.md's
capacity model. Run from the repository's root:
`.venv/bin/python -m tools.bench.capacity [--timers N] [--runs 3]`.

On an embedded Postgres with fsync on (as production runs) and an embedded NATS, each run:
  1. intake: N ScheduleTimer commands due in a day, waiting in the stream, stored by the replicas;
  2. sizes: heap and each index per stored timer (after VACUUM ANALYZE, as autovacuum leaves it);
  3. drain: N overdue timers seeded, then claimed, published and marked by the replicas;
  4. vacuum: the VACUUM that cleans up after the drain, timed.
For each phase the deltas of the WAL position and records, pg_stat_io (PostgreSQL 18: WAL and data
writes and fsyncs) and the CPU time of every Postgres process (/proc). A calibration of the machine (a
fixed CPU loop, an fsync probe) is printed beside the figures; medians of the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from tools.bench.context import schedule_command
from tools.bench.rig import Rig, machine
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres

REPLICAS = 3
STATS_FLUSH_S = 1.5
STATS = """
SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint,
       coalesce(sum(writes) FILTER (WHERE object = 'wal'), 0)::bigint,
       coalesce(sum(fsyncs) FILTER (WHERE object = 'wal'), 0)::bigint,
       coalesce(sum(writes) FILTER (WHERE object <> 'wal'), 0)::bigint,
       coalesce(sum(fsyncs) FILTER (WHERE object <> 'wal'), 0)::bigint
FROM pg_stat_io
"""
SIZES = """
SELECT CASE WHEN c.relname LIKE 'pg_toast%%' THEN 'toast' ELSE c.relname END, pg_relation_size(c.oid)
FROM pg_class c
WHERE c.relname IN ('timers', 'timers_pkey', 'timers_due', 'timers_finished')
   OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE relname = 'timers')
"""


def pg_cpu_s(pg: EmbeddedPostgres) -> float:
    """CPU seconds of the postmaster and every backend and helper it started, so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(stat.parent.name), int(fields[1])
        if pid == pg.pid:  # its own time, and that of the children it reaped (autovacuum workers)
            total += sum(int(f) for f in fields[11:15]) / tick
        elif ppid == pg.pid:
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def snapshot(pg: EmbeddedPostgres) -> dict[str, float]:
    """Counters so far. A CHECKPOINT first, so the phase pays for the pages it dirtied; then a
    pause for the backends to report their statistics (they do once idle, at most every second)."""
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        time.sleep(STATS_FLUSH_S)
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(STATS).fetchone()
    assert row is not None
    names = ["wal_bytes", "wal_writes", "wal_fsyncs", "data_writes", "data_fsyncs"]
    return {**dict(zip(names, map(float, row), strict=True)), "cpu_s": pg_cpu_s(pg)}


def per(before: dict[str, float], after: dict[str, float], n: int, seconds: float) -> dict[str, float]:
    out = {k: (after[k] - before[k]) / n for k in before}
    out["cpu_ms"] = out.pop("cpu_s") * 1000
    out["per_s"] = n / seconds  # timers per second of the phase (intake: replica start-up included)
    return out


async def until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("the run did not finish in time")
        await asyncio.sleep(0.2)


async def one_run(pg: EmbeddedPostgres, nats_url: str, workdir: Path, n: int) -> dict[str, Any]:
    async with Rig(pg.url, nats_url, workdir) as rig:
        prefix = rig.names["subject_prefix"]
        due = datetime.now(UTC) + timedelta(days=1)
        await rig.publish_commands(schedule_command(prefix, f"t{i % 10}", f"i-{i}", due) for i in range(n))
        before, started = snapshot(pg), time.monotonic()
        rig.start_replicas(REPLICAS)

        async def stored() -> bool:
            return int(await rig.scalar("SELECT count(*) FROM timers")) >= n

        await until(stored, 120 + n / 500)
        took = time.monotonic() - started
        intake = per(before, snapshot(pg), n, took)
        await rig.db_.execute("VACUUM ANALYZE timers")
        sizes = {name: size / n for name, size in (await (await rig.db_.execute(SIZES)).fetchall())}

        await rig.seed(n, start_s=-3660, rate=n / 3600, key_prefix="d-")
        before, started = snapshot(pg), time.monotonic()

        async def drained() -> bool:
            left = await rig.scalar(
                "SELECT count(*) FROM timers WHERE state = 'Scheduled' AND due_at < now()"
            )
            return int(left) == 0

        await until(drained, 120 + n / 200)
        took = time.monotonic() - started
        fire = per(before, snapshot(pg), n, took)
        before, started = snapshot(pg), time.monotonic()
        await rig.db_.execute("VACUUM timers")
        took = time.monotonic() - started
        vacuum = per(before, snapshot(pg), n, took)  # what autovacuum left: the rest is in the phases
        return {"intake": intake, "sizes": sizes, "fire": fire, "vacuum": vacuum}


def calibration(workdir: Path) -> dict[str, float]:
    started = time.process_time()
    total = 0
    for i in range(20_000_000):  # a fixed amount of CPU work
        total += i
    cpu_loop_s = time.process_time() - started
    probe = workdir / "fsync-probe"
    with probe.open("wb") as f:
        started = time.perf_counter()
        for _ in range(200):
            f.write(b"x" * 8192)
            f.flush()
            os.fsync(f.fileno())
        fsync_ms = (time.perf_counter() - started) * 1000 / 200
    return {"cpu_loop_s": cpu_loop_s, "fsync_ms": fsync_ms}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        phase: {k: statistics.median(r[phase][k] for r in runs) for k in runs[0][phase]} for phase in runs[0]
    }


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.capacity",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--timers", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with EmbeddedPostgres(work / "pg", fsync=True) as pg, EmbeddedNats(work / "nats") as nats_server:
            runs = []
            calibrations = []
            for i in range(args.runs):
                calibrations.append(calibration(work))
                runs.append(asyncio.run(one_run(pg, nats_server.url, work, args.timers)))
                print(f"run {i + 1}: {json.dumps({**runs[-1], 'calibration': calibrations[-1]})}", flush=True)
            with psycopg.connect(pg.url, autocommit=True) as conn:
                version = conn.execute("SHOW server_version").fetchone()
    report = {
        "timers": args.timers,
        "replicas": REPLICAS,
        "postgres": version[0] if version else "?",
        "machine": machine(),
        "calibration": {k: statistics.median(c[k] for c in calibrations) for k in calibrations[0]},
        "medians": medians(runs),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
