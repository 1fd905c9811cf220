"""A/B of the producer's bulk path: `TimerClient.schedule_many` of worker/client/ (and its wire
code, wire.py and batches.py) at a git revision against this tree's, taking turns round by round on
one embedded nats-server.

    python -m tools.bench.producer_ab --against main       # 6 rounds of 50,000 commands each

The command stream allows atomic and fast-ingest batches; both clients send with
`--fast-ingest` (default "on": on this one-replica stream "auto" would keep atomic batches), a
client older than that setting as it did. `--sync-always`: the server fsyncs every JetStream write.

On a shared machine the `producer` scenario's rate moves with other work more than with the
client; here the two versions alternate (the order swapping each round), and beside each rate
stand the CPU seconds the client and nats-server spent per command, the figures that hold on a
loaded machine. Linux only (the server's CPU is read from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
from nats.js import api

import worker.client
from tools.bench.calibrate import cpu_loop_ms
from worker.client.batches import CLIENT_KNOWS_BATCHED, server_has_fast_ingest
from worker.devkit.embedded import EmbeddedNats

PROG = "python -m tools.bench.producer_ab"
ROOT = Path(__file__).resolve().parents[2]
CALL_SIZE = 10_000  # as the producer scenario and `timer-service schedule --from-file`


def source_at(rev: str, path: str) -> str:
    shown = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if shown.returncode != 0:
        raise ValueError(f"no {path} at {rev!r}: {shown.stderr.strip()}")
    return shown.stdout


def module_of(source: str, origin: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[module.__name__] = module  # dataclasses look their module up while the classes are made
    exec(compile(source, origin, "exec"), module.__dict__)
    return module


# Where the producer client and what it sends through lived, by layout: its module last, the
# modules it imports before it in the order they import each other. Older modules of the client's
# own than these are this tree's (they decide nothing of the bulk path's cost).
LAYOUTS = (
    ("worker/client/producer.py", ("worker.client.wire", "worker.client.batches", "worker.client.envelopes")),
    ("worker/client.py", ("worker.natsconn", "worker.envelopes", "worker.consumer")),
)


def _layout_at(rev: str) -> tuple[str, str, tuple[str, ...]]:
    """The client's path and source at `rev`, and the modules to bring with it."""
    for path, names in LAYOUTS:
        with contextlib.suppress(ValueError):
            return path, source_at(rev, path), names
    raise ValueError(f"no worker/client/producer.py or worker/client.py at {rev!r}")


def client_at(rev: str) -> types.ModuleType:
    """The producer client as it was at a git revision, with the wire code it sends through (this
    tree's would make the older client as fast as this one) and its envelopes as they were then,
    where the revision has them, importing this tree's other modules. A revision with the client
    in worker/client.py (before worker/client/) brings its worker/consumer.py too: this tree has
    no module of that name."""
    path, client, names = _layout_at(rev)
    olders: dict[str, str] = {}
    for name in names:
        with contextlib.suppress(ValueError):  # a revision before the module was cut out
            olders[name] = source_at(rev, name.replace(".", "/") + ".py")
    ours = {name: sys.modules.get(name) for name in olders}
    try:
        for name, source in olders.items():
            # what the older client's `from worker.natsconn import` (or envelopes...) finds
            sys.modules[name] = module_of(source, f"{rev}:{name}", f"_{name.rpartition('.')[2]}_at_{rev}")
        return module_of(client, f"{rev}:{path}", f"_client_at_{rev}")
    finally:
        for name, module in ours.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def one_round(
    url: str, client: types.ModuleType, pid: int, n: int, tag: str, options: dict[str, Any]
) -> dict[str, float]:
    due = datetime.now(UTC) + timedelta(days=1)
    wall = cpu = server = 0.0
    async with await client.TimerClient.connect(url, "svc", **options) as timers:
        for start in range(0, n, CALL_SIZE):
            calls = [
                {"tenantId": f"t{k % 10}", "serviceCallId": f"{tag}-{k}", "dueAt": due}
                for k in range(start, min(start + CALL_SIZE, n))
            ]
            w, c, s = time.perf_counter(), time.process_time(), server_cpu_s(pid)
            sent = await timers.schedule_many(calls)
            wall += time.perf_counter() - w
            cpu += time.process_time() - c
            server += server_cpu_s(pid) - s
            if any(x.outcome != "accepted" for x in sent):
                raise RuntimeError(f"{tag}: not every command was accepted")
    return {"commands_per_s": n / wall, "client_us": cpu / n * 1e6, "server_us": server / n * 1e6}


async def measure(
    versions: dict[str, types.ModuleType], rounds: int, n: int, fast_ingest: str, sync_always: bool
) -> dict[str, Any]:
    workdir = tempfile.TemporaryDirectory(prefix="producer-ab-")  # the server's store, removed after
    server = EmbeddedNats(Path(workdir.name), sync_always=sync_always)
    server.start()
    try:
        nc = await nats.connect(server.url)
        config = api.StreamConfig(
            name="COMMANDS", subjects=["svc.*.timer.schedule"], duplicate_window=120, allow_atomic=True
        )
        if CLIENT_KNOWS_BATCHED and server_has_fast_ingest(nc):
            config.allow_batched = True  # as the service makes it (adapters/streams.py)
        await nc.jetstream().add_stream(config)
        assert server.pid is not None
        seen: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
        for r in range(rounds):
            for name in list(versions)[:: 1 if r % 2 == 0 else -1]:
                await nc.jetstream().purge_stream("COMMANDS")  # each round into an empty stream
                # Both in the same batches whenever both can choose (an older client without the
                # setting sends as it did): a fast-ingest client against an atomic one measured
                # the batch kind, not the code (1.23 x between two copies of one client).
                knows = "fast_ingest" in inspect.signature(versions[name].TimerClient.connect).parameters
                options = {"fast_ingest": fast_ingest} if knows else {}
                seen[name].append(
                    await one_round(server.url, versions[name], server.pid, n, f"{name}{r}", options)
                )
        await nc.close()
    finally:
        server.stop()
        workdir.cleanup()
    return {
        f"{metric}@{name}": round(statistics.median(x[metric] for x in runs), 1)
        for name, runs in seen.items()
        for metric in ("commands_per_s", "client_us", "server_us")
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--against", metavar="REV", required=True, help="the producer client at this git revision")
    p.add_argument("--rounds", type=int, default=6, help="rounds; medians count (default 6)")
    p.add_argument(
        "--commands", type=int, default=50_000, help="commands per version per round (default 50,000)"
    )
    p.add_argument(
        "--fast-ingest",
        choices=["auto", "on", "off"],
        default="on",
        help="the clients' fast_ingest, where a client has it (default on)",
    )
    p.add_argument("--sync-always", action="store_true", help="the server fsyncs every JetStream write")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.rounds < 1 or args.commands < 1:
        print(f"{PROG}: --rounds and --commands must be at least 1", file=sys.stderr)
        return 2
    try:
        versions = {"this": worker.client, args.against: client_at(args.against)}
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    calibration = [cpu_loop_ms()]
    result = asyncio.run(measure(versions, args.rounds, args.commands, args.fast_ingest, args.sync_always))
    calibration.append(cpu_loop_ms())
    # CPU is read in clock ticks (10 ms): a tiny run may show a server at 0, with no ratio.
    ratios: dict[str, float | None] = {}
    for metric in ("commands_per_s", "client_us", "server_us"):
        other = result[f"{metric}@{args.against}"]
        ratios[f"{metric}_this/{args.against}"] = (
            round(result[f"{metric}@this"] / other, 3) if other else None
        )
    report = {
        "rounds": args.rounds,
        "commands": args.commands,
        "fast_ingest": args.fast_ingest,
        "nats_sync": "always" if args.sync_always else "default",
        "cpu_loop_ms": calibration,
        **result,
        **ratios,
    }
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
