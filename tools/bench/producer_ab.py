"""A/B of the producer's bulk path: `schedule_many` at a git revision against this tree's, in turns."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import statistics
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
from tools.bench.report import around_loop, module_at, parse, parser
from tools.bench.rig import tree_cpu_s
from worker.client.batches import CLIENT_KNOWS_BATCHED, server_has_fast_ingest
from worker.devkit.embedded import EmbeddedNats

PROG = "python -m tools.bench.producer_ab"
CALL_SIZE = 10_000  # as the producer scenario and `timer-service schedule --from-file`


# Where the client lived, by layout, and the modules it sends through, in the order they import
# each other; the revision's own, the rest this tree's.
LAYOUTS = (
    ("worker/client/producer.py", ("worker.client.wire", "worker.client.batches", "worker.client.envelopes")),
    ("worker/client.py", ("worker.natsconn", "worker.envelopes", "worker.consumer")),
)


def client_at(rev: str) -> types.ModuleType:
    """The producer client at a git revision with the wire code and envelopes it had (this tree's
    would make it as fast as this one), importing this tree's other modules."""
    for path, names in LAYOUTS:
        ours = {name: sys.modules.get(name) for name in names}
        try:
            for name in names:  # what the older client's `from worker.natsconn import` (...) finds
                with contextlib.suppress(ValueError):  # a revision before the module was cut out
                    short = name.rpartition(".")[2]
                    sys.modules[name] = module_at(rev, name.replace(".", "/") + ".py", f"_{short}_at_{rev}")
            with contextlib.suppress(ValueError):
                return module_at(rev, path, f"_client_at_{rev}")
        finally:
            for name, module in ours.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module
    raise ValueError(f"no worker/client/producer.py or worker/client.py at {rev!r}")


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
            w, c, s = time.perf_counter(), time.process_time(), tree_cpu_s([pid])
            sent = await timers.schedule_many(calls)
            wall += time.perf_counter() - w
            cpu += time.process_time() - c
            server += tree_cpu_s([pid]) - s
            if any(x.outcome != "accepted" for x in sent):
                raise RuntimeError(f"{tag}: not every command was accepted")
    return {"commands_per_s": n / wall, "client_us": cpu / n * 1e6, "server_us": server / n * 1e6}


async def measure(
    versions: dict[str, types.ModuleType], rounds: int, n: int, fast_ingest: str, sync_always: bool
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="producer-ab-") as tmp,
        EmbeddedNats(Path(tmp), sync_always=sync_always) as server,
    ):
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
                # the same batches whenever both can choose: else the batch kind is measured
                knows = "fast_ingest" in inspect.signature(versions[name].TimerClient.connect).parameters
                options = {"fast_ingest": fast_ingest} if knows else {}
                seen[name].append(
                    await one_round(server.url, versions[name], server.pid, n, f"{name}{r}", options)
                )
        await nc.close()
    return {
        f"{metric}@{name}": round(statistics.median(x[metric] for x in runs), 1)
        for name, runs in seen.items()
        for metric in ("commands_per_s", "client_us", "server_us")
    }


def main(argv: list[str] | None = None) -> int:
    counts = {"rounds": (6, "rounds; medians count"), "commands": (50_000, "commands per version per round")}
    p = parser(PROG, __doc__, counts, json_=False)
    p.add_argument("--against", metavar="REV", required=True, help="the producer client at this git revision")
    p.add_argument(
        "--fast-ingest", choices=["auto", "on", "off"], default="on", help="the clients' (default on)"
    )
    p.add_argument("--sync-always", action="store_true", help="the server fsyncs every JetStream write")
    if (args := parse(p, argv)) is None:
        return 2
    try:
        versions = {"this": worker.client, args.against: client_at(args.against)}
    except ValueError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    report: dict[str, Any] = {
        "rounds": args.rounds,
        "commands": args.commands,
        "fast_ingest": args.fast_ingest,
    }
    report["nats_sync"] = "always" if args.sync_always else "default"
    measured = (versions, args.rounds, args.commands, args.fast_ingest, args.sync_always)
    report |= around_loop(lambda: asyncio.run(measure(*measured)))
    for metric in ("commands_per_s", "client_us", "server_us"):
        other = report[f"{metric}@{args.against}"]  # in clock ticks: a tiny run's server may show 0
        report[f"{metric}_this/{args.against}"] = (
            round(report[f"{metric}@this"] / other, 3) if other else None
        )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
