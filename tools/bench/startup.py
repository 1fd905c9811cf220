"""How long a replica takes from its process start to its first firing, over many runs."""

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

from tools.bench.report import brief, medians, parser, say
from tools.bench.rig import Rig


async def _one(rig: Rig, run: int, replicas: int, timeout: float = 60) -> dict[str, float]:
    """`replicas` started on one overdue timer: to `replica_started` in the first one's log, to the
    first event stored, and their CPU by then."""
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
    up = min(
        (_logged(rig.workdir / f"{name}.log") for name in names), key=lambda x: math.inf if x != x else x
    )
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


def _logged(path: Path) -> float:
    """The time of the replica's `replica_started` log line (JSON, millisecond resolution)."""
    for line in path.read_text().splitlines():
        if line.startswith("{") and (rec := json.loads(line)).get("action") == "replica_started":
            return datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).timestamp()
    return float("nan")


def main(argv: list[str] | None = None) -> int:
    p = parser("python -m tools.bench.startup", __doc__, {})
    p.add_argument("--runs", type=int, default=15, help="replica starts (default 15)")
    p.add_argument("--replicas", type=int, default=1, help="replicas started together (default 1)")
    p.add_argument("--keep", type=Path, help="keep the servers' data and the replicas' logs here")
    p.add_argument(
        "--source", action="store_true", help="no byte-compiling first: replicas compile as they start"
    )
    p.add_argument("--connect", action="store_true", help="time only Replica.connect, in this process")
    args = p.parse_args(argv)
    from worker.devkit.dev import servers  # embedded servers, or TIMER_DATABASE_URL / TIMER_NATS_URL

    async def runs(db: str, nats: str, workdir: Path) -> list[dict[str, float]]:
        out = []
        async with Rig(db, nats, workdir, byte_compile=not args.source, log_level="INFO") as rig:
            for i in range(args.runs):
                out.append(await (_connect(rig) if args.connect else _one(rig, i, args.replicas)))
                say(f"startup {i + 1}/{args.runs}", brief(out[-1], "{:.3f}".format))
        return out

    with contextlib.ExitStack() as stack:
        workdir = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="timer-startup-")))
        results = asyncio.run(runs(*stack.enter_context(servers(workdir, sync_always=False)), workdir))
    if args.json:
        print(json.dumps({"runs": results, "median": medians(results)}, indent=2))
        return 0
    for key in results[0]:
        values = sorted(r[key] for r in results)
        print(f"{key}: median {statistics.median(values):.3f} s (min {values[0]:.3f}, max {values[-1]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
