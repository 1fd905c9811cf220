"""What the partial index `timers_correlation` costs intake: the same batches with and without it."""

from __future__ import annotations

import sys
import time
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from tools.bench.report import brief, medians, on_servers, parse, parser, say, table_of
from tools.bench.rig import BACKEND_PID_SQL, Rig, tree_cpu_s
from worker.adapters.postgres.db import pool
from worker.adapters.postgres.store import Store
from worker.contract import ScheduleTimer

BATCH = 1000  # intake applies a fetch of up to 1,000 commands per transaction


async def _apply(rig: Rig, store: Store, pid: int, kind: str, first: int, batches: int) -> dict[str, float]:
    """`batches` batches of BATCH commands of one kind, from key `first`; the costs per 1,000."""
    due = datetime.now(UTC) + timedelta(days=1 if kind == "insert" else 2)
    lsn = await rig.scalar("SELECT pg_current_wal_lsn()")
    cpu, wall = tree_cpu_s([pid]), 0.0
    for b in range(first, first + batches * BATCH, BATCH):
        ms = time.time_ns() // 1_000_000
        commands = [
            ScheduleTimer(f"t{k % 10}", f"k-{k}", due, f"order-{k}", ms, None) for k in range(b, b + BATCH)
        ]
        started = time.perf_counter()
        applied = (await store.apply(commands)).outcomes.count("applied")
        wall += time.perf_counter() - started
        if applied != BATCH:
            raise RuntimeError(f"{kind} batch applied {applied} of {BATCH}")
    wal = float(await rig.scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", lsn))
    per = 1000 / (batches * BATCH)
    cpu = tree_cpu_s([pid]) - cpu
    return {
        f"{kind}_ms": wall * 1000 * per,
        f"{kind}_cpu_ms": cpu * 1000 * per,
        f"{kind}_wal_kb": wal / 1024 * per,
    }


async def run(admin_url: str, nats_url: str, workdir: Any, rounds: int, batches: int) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        variants = {}
        for name in ("with_index", "without_index"):
            rig = await stack.enter_async_context(Rig(admin_url, nats_url, workdir))
            if name == "without_index":
                await rig.db_.execute("DROP INDEX timers_correlation")  # the A/B's one difference
            p = pool(rig.db_url, f"indexcost-{name}", 1, 1, idle_in_transaction_ms=60_000)  # one backend
            await p.open()
            stack.push_async_callback(p.close)
            async with p.connection() as conn:
                row = await (await conn.execute(BACKEND_PID_SQL)).fetchone()
            assert row is not None
            variants[name] = (rig, Store(p), int(row[0]))
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for r in range(rounds):
            for name in list(variants)[:: 1 if r % 2 == 0 else -1]:  # a slow moment hits both in turn
                first = r * batches * BATCH  # each round's inserts are new timers, then rescheduled
                insert = await _apply(*variants[name], "insert", first, batches)
                runs[name].append(insert | await _apply(*variants[name], "reschedule", first, batches))
            say(
                f"indexcost {r + 1}/{rounds}",
                "; ".join(f"{n}: {brief(m[-1], '{:.1f}'.format)}" for n, m in runs.items()),
            )
        index_kb = {}
        for name, (rig, _, _) in variants.items():
            size = await rig.scalar("SELECT pg_relation_size(to_regclass('timers_correlation'))")
            index_kb[name] = None if size is None else size / 1024
    median = {name: medians(ms) for name, ms in runs.items()}
    with_, without = median["with_index"], median["without_index"]
    ratio = {k: with_[k] / without[k] if without[k] else float("nan") for k in with_}
    return {"rounds": runs, "median": median, "with_over_without": ratio, "index_kb": index_kb}


def main(argv: list[str] | None = None) -> int:
    p = parser(
        "python -m tools.bench.indexcost",
        __doc__,
        {"rounds": (7, "A/B rounds"), "batches": (10, "batches of 1,000 per kind and round")},
    )
    if (args := parse(p, argv)) is None:
        return 2
    result = on_servers(p, argv, args, lambda db, nats, work: run(db, nats, work, args.rounds, args.batches))
    if isinstance(result, dict):
        print(table_of(result["median"] | {"with ÷ without": result["with_over_without"]}))
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
