"""How long a replica takes from its process start to its first firing, over many runs.

Each run starts `--replicas` replicas at once on a migrated database with one timer overdue, and
times from the start to `replica_started` in the first one's log and to the first event stored,
with their CPU by then; `--connect` times Replica.connect alone, in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from tools.bench.report import brief, medians, parser
from tools.bench.rig import Rig


async def _one(rig: Rig, run: int, replicas: int, timeout: float) -> dict[str, float]:
    before = (await rig.events_state()).messages
    await rig.seed(1, start_s=-60, rate=1, key_prefix=f"s{run}-")
    started_at = time.time()
    names = rig.start_replicas(replicas)
    deadline = time.monotonic() + timeout
    while (state := await rig.events_state()).messages <= before:
        if time.monotonic() > deadline:
            raise RuntimeError(f"no firing within {timeout:.0f}s; logs in {rig.workdir}")
        await asyncio.sleep(0.05)
    cpu = rig.cpu_s()  # up to a poll after the first firing: the start-up's CPU, a little idling
    await asyncio.to_thread(rig.fleet.terminate_all)
    # one stopped before it started (another fired first) logged no replica_started
    up = min((_logged(rig.workdir / f"{name}.log", "replica_started") for name in names), key=_nan_last)
    return {"started_s": up - started_at, "first_fire_s": state.last_ts - started_at, "cpu_s": cpu}


async def _connect(rig: Rig) -> dict[str, float]:
    from worker.service import Replica

    replica = Replica(rig.settings)
    started = time.perf_counter()
    try:
        await replica.connect()
        return {"connect_s": time.perf_counter() - started}
    finally:
        await replica.broker.close()
        await replica.store.close()
        await replica.pool.close()


def _nan_last(x: float) -> float:
    return float("inf") if math.isnan(x) else x


def _logged(path: Path, action: str) -> float:
    """The time of the replica's first log line with this action (JSON, millisecond resolution)."""
    for line in path.read_text().splitlines():
        if line.startswith("{") and (rec := json.loads(line)).get("action") == action:
            return datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).timestamp()
    return float("nan")


async def _runs(
    db_url: str,
    nats_url: str,
    workdir: Path,
    runs: int,
    replicas: int,
    byte_compile: bool,
    connect_only: bool,
) -> list[dict[str, float]]:
    out = []
    async with Rig(db_url, nats_url, workdir, byte_compile=byte_compile, log_level="INFO") as rig:
        for i in range(runs):
            out.append(await (_connect(rig) if connect_only else _one(rig, i, replicas, timeout=60)))
            print(f"[startup {i + 1}/{runs}] {brief(out[-1], '{:.3f}'.format)}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser("python -m tools.bench.startup", __doc__)
    p.add_argument("--runs", type=int, default=15, help="replica starts (default 15)")
    p.add_argument("--replicas", type=int, default=1, help="replicas started together (default 1)")
    p.add_argument("--keep", type=Path, help="keep the servers' data and the replicas' logs here")
    p.add_argument(
        "--source", action="store_true", help="no byte-compiling first: replicas compile as they start"
    )
    p.add_argument("--connect", action="store_true", help="time only Replica.connect, in this process")
    p.add_argument("--json", action="store_true", help="print every run and the medians as JSON")
    args = p.parse_args(argv)
    from worker.devkit.dev import servers  # embedded servers, or TIMER_DATABASE_URL / TIMER_NATS_URL

    with contextlib.ExitStack() as stack:
        workdir = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="timer-startup-")))
        db, nats = stack.enter_context(servers(workdir, sync_always=False))
        results = asyncio.run(
            _runs(db, nats, workdir, args.runs, args.replicas, not args.source, args.connect)
        )
    if args.json:
        print(json.dumps({"runs": results, "median": medians(results)}, indent=2))
        return 0
    for key in results[0]:
        values = sorted(r[key] for r in results)
        print(f"{key}: median {statistics.median(values):.3f} s (min {values[0]:.3f}, max {values[-1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
