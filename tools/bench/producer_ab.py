"""A/B of the producer's bulk path: `TimerClient.schedule_many` (with its wire code) at a git
revision against this tree's, taking turns round by round on one embedded nats-server; beside each
rate the CPU the client and the server spent per command, which holds on a loaded machine.
"""

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
from tools.bench.report import around_loop, module_of, parser, positive, source_at
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


def _layout_at(rev: str) -> tuple[str, str, tuple[str, ...]]:
    """The client's path and source at `rev`, and the modules to bring with it."""
    for path, names in LAYOUTS:
        with contextlib.suppress(ValueError):
            return path, source_at(rev, path), names
    raise ValueError(f"no worker/client/producer.py or worker/client.py at {rev!r}")


def client_at(rev: str) -> types.ModuleType:
    """The producer client at a git revision with the wire code and envelopes it had (this tree's
    would make it as fast as this one), importing this tree's other modules."""
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
    p = parser(PROG, __doc__)
    p.add_argument("--against", metavar="REV", required=True, help="the producer client at this git revision")
    p.add_argument("--rounds", type=int, default=6, help="rounds; medians count (default 6)")
    p.add_argument(
        "--commands", type=int, default=50_000, help="commands per version per round (default 50,000)"
    )
    p.add_argument(
        "--fast-ingest", choices=["auto", "on", "off"], default="on", help="the clients' (default on)"
    )
    p.add_argument("--sync-always", action="store_true", help="the server fsyncs every JetStream write")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not positive(PROG, args, "--rounds", "--commands"):
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
