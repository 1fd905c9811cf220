"""What one Postgres spends per stored and per fired timer: the inputs of docs/OPERATIONS.md's
capacity model.

On an embedded Postgres with fsync on, each run: intake of N ScheduleTimers waiting in the stream;
the table's and indexes' size per timer; a drain of N overdue timers; the VACUUM after it. Per
phase the WAL, pg_stat_io's writes and fsyncs, and every Postgres process's CPU; medians.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg

from tools.bench.report import calibrate, machine, medians, parser
from tools.bench.rig import Rig, schedule_command, tree_cpu_s
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
    return {**dict(zip(names, map(float, row), strict=True)), "cpu_s": tree_cpu_s([pg.pid] if pg.pid else [])}


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


def main() -> None:
    p = parser("python -m tools.bench.capacity", __doc__)
    p.add_argument("--timers", type=int, default=100_000)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with EmbeddedPostgres(work / "pg", fsync=True) as pg, EmbeddedNats(work / "nats") as nats_server:
            runs, calibrations = [], []
            for i in range(args.runs):
                calibrations.append(calibrate(work))
                runs.append(asyncio.run(one_run(pg, nats_server.url, work, args.timers)))
                print(f"run {i + 1}: {json.dumps({**runs[-1], 'calibration': calibrations[-1]})}", flush=True)
            with psycopg.connect(pg.url, autocommit=True) as conn:
                version = conn.execute("SHOW server_version").fetchone()
    report = {
        "timers": args.timers,
        "replicas": REPLICAS,
        "postgres": version[0] if version else "?",
        "machine": machine(),
        "calibration": calibrations,
        "medians": {phase: medians([r[phase] for r in runs]) for phase in runs[0]},
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
