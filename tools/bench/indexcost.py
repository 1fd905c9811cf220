"""What the partial index `timers_correlation` costs intake's Postgres work.

Two databases, one without the index, take the same batches through Store.apply in alternating
turns: ScheduleTimers all carrying a correlationId, as inserts then as reschedules (not HOT). Per
1,000 commands: wall time, the backend's CPU (/proc) and WAL; medians, and with over without.
"""

from __future__ import annotations

import sys
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tools.bench.report import brief, medians, on_servers, parser, positive
from tools.bench.rig import BACKEND_PID_SQL, Rig, tree_cpu_s
from worker.adapters.postgres.db import pool
from worker.adapters.postgres.store import Store
from worker.contract import ScheduleTimer

PROG = "python -m tools.bench.indexcost"
BATCH = 1000  # intake applies a fetch of up to 1,000 commands per transaction
DROP_INDEX_SQL = "DROP INDEX timers_correlation"  # bench-only: the A/B's one difference
WAL_LSN_SQL = "SELECT pg_current_wal_lsn()"
WAL_BYTES_SQL = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)"
INDEX_BYTES_SQL = "SELECT pg_relation_size(to_regclass('timers_correlation'))"
KINDS = ("insert", "reschedule")


@dataclass
class Variant:
    name: str
    rig: Rig
    store: Store
    backend_pid: int
    keys: int = 0  # timers made so far: each round's inserts are new ones


def _commands(first: int, n: int, due: datetime) -> list[ScheduleTimer]:
    return [
        ScheduleTimer(f"t{k % 10}", f"k-{k}", due, f"order-{k}", time.time_ns() // 1_000_000, None)
        for k in range(first, first + n)
    ]


async def _apply(v: Variant, kind: str, batches: int) -> dict[str, float]:
    """`batches` batches of BATCH commands of one kind on one variant; the costs per 1,000."""
    base = v.keys if kind == "insert" else v.keys - batches * BATCH
    due = datetime.now(UTC) + timedelta(days=1 if kind == "insert" else 2)
    lsn = await v.rig.scalar(WAL_LSN_SQL)
    cpu, wall = tree_cpu_s([v.backend_pid]), 0.0
    for b in range(batches):
        commands = _commands(base + b * BATCH, BATCH, due)
        started = time.perf_counter()
        applied = await v.store.apply(commands)
        wall += time.perf_counter() - started
        if applied.outcomes.count("applied") != BATCH:
            raise RuntimeError(
                f"{v.name}: {kind} batch applied {applied.outcomes.count('applied')} of {BATCH}"
            )
    cpu = tree_cpu_s([v.backend_pid]) - cpu
    wal = float(await v.rig.scalar(WAL_BYTES_SQL, lsn))
    if kind == "insert":
        v.keys += batches * BATCH
    per = 1000 / (batches * BATCH)
    return {
        f"{kind}_ms": wall * 1000 * per,
        f"{kind}_cpu_ms": cpu * 1000 * per,
        f"{kind}_wal_kb": wal / 1024 * per,
    }


async def run(admin_url: str, nats_url: str, workdir: Path, rounds: int, batches: int) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        variants = []
        for name in ("with_index", "without_index"):
            rig = await stack.enter_async_context(Rig(admin_url, nats_url, workdir))
            if name == "without_index":
                await rig.db_.execute(DROP_INDEX_SQL)
            # one backend: its CPU is the cost
            p = pool(rig.db_url, f"indexcost-{name}", 1, 1, idle_in_transaction_ms=60_000)
            await p.open()
            stack.push_async_callback(p.close)
            async with p.connection() as conn:
                row = await (await conn.execute(BACKEND_PID_SQL)).fetchone()
            assert row is not None
            variants.append(Variant(name, rig, Store(p), int(row[0])))
        runs: dict[str, list[dict[str, float]]] = {v.name: [] for v in variants}
        for r in range(rounds):
            order = variants if r % 2 == 0 else variants[::-1]  # a slow moment hits both in turn
            for v in order:
                m: dict[str, float] = {}
                for kind in KINDS:
                    m |= await _apply(v, kind, batches)
                runs[v.name].append(m)
            said = "; ".join(f"{n}: {brief(ms[-1], '{:.1f}'.format)}" for n, ms in runs.items())
            print(f"[indexcost {r + 1}/{rounds}] {said}", file=sys.stderr, flush=True)
        index_kb = {v.name: _kb(await v.rig.scalar(INDEX_BYTES_SQL)) for v in variants}
    median = {name: medians(ms) for name, ms in runs.items()}
    with_, without = median["with_index"], median["without_index"]
    ratio = {k: with_[k] / without[k] if without[k] else float("nan") for k in with_}
    return {"rounds": runs, "median": median, "with_over_without": ratio, "index_kb": index_kb}


def _kb(size: int | None) -> float | None:
    return None if size is None else size / 1024


def main(argv: list[str] | None = None) -> int:
    p = parser(PROG, __doc__)
    p.add_argument("--rounds", type=int, default=7, help="A/B rounds; medians over them (default 7)")
    p.add_argument(
        "--batches", type=int, default=10, help="batches of 1,000 of each kind per round (default 10)"
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not positive(PROG, args, "--rounds", "--batches"):
        return 2
    result = on_servers(
        PROG, argv, lambda db, nats, work: run(db, nats, work, args.rounds, args.batches), args.json
    )
    if isinstance(result, int):
        return result
    print("\n| per 1,000 commands | with index | without | with ÷ without |\n|---|---|---|---|")
    for k, ratio in result["with_over_without"].items():
        w, wo = result["median"]["with_index"][k], result["median"]["without_index"][k]
        print(f"| {k} | {w:.1f} | {wo:.1f} | {ratio:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
