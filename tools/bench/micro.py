"""Micro-benchmarks of the firing path's pure CPU code: per-call time of `firing_id` and
`due_event` on a drain's occurrences, and of publishing their events in an atomic batch (nats-py's
`publish` one by one against `publish_all`); the best of several rounds, and with `--against`
worker/contract.py at a git revision taking turns with this tree's.
"""

from __future__ import annotations

import asyncio
import json
import sys
import timeit
import types
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from nats.aio.client import Client as NATS

import worker.contract
from tools.bench.report import around_loop, module_of, parser, positive, source_at
from worker.client.batches import atomic_batch_headers
from worker.client.wire import Message, publish_all
from worker.core.domain import Claimed

PROG = "python -m tools.bench.micro"
SECRET = b"a fleet secret of thirty-two b.."
BATCH = 1000  # a full claim's batch: the firing loop builds its events in one list comprehension


def occurrences(n: int = BATCH) -> list[Claimed]:
    """A batch as a drain claims it: ten tenants, distinct keys and due times, a tenth correlated."""
    start = datetime(2026, 11, 23, 9, tzinfo=UTC)
    out = []
    for i in range(n):
        due = start + timedelta(microseconds=3_600_000_000 * i // n)
        corr = f"order-{i}" if i % 10 == 0 else None
        out.append(
            Claimed(f"t{i % 10}", f"d-{i}", due, corr, 7, 1, None, None, None, None, 0, due, f"(0,{i})")
        )
    return out


def cases(contract: types.ModuleType) -> dict[str, Callable[[], object]]:
    """Each case makes one batch, as the firing loop does."""
    batch = occurrences()
    ids = contract.MessageIds(SECRET)
    reached = datetime(2026, 11, 23, 10, tzinfo=UTC)
    reached_iso, reached_ms = contract.iso(reached), round(reached.timestamp() * 1000)
    firing_id, due_event = contract.firing_id, contract.due_event

    def ids_only() -> object:
        return [firing_id(c.tenant_id, c.service_call_id, c.due_at) for c in batch]

    def events() -> object:
        return [
            due_event(c, "svc." + c.tenant_id + ".timer.due", reached_iso, reached_ms, ids) for c in batch
        ]

    return {"firing_id": ids_only, "due_event": events}


def publish_cases(loop: asyncio.AbstractEventLoop) -> dict[str, dict[str, Callable[[], object]]]:
    """A claim's events sent as an atomic batch on a client that seems connected and whose output
    is dropped after each batch: nats-py's `publish` and `publish_all`."""
    reached = datetime(2026, 11, 23, 10, tzinfo=UTC)
    ids = worker.contract.MessageIds(SECRET)
    events = [
        worker.contract.due_event(
            c, "svc." + c.tenant_id + ".timer.due", worker.contract.iso(reached), 0, ids
        )
        for c in occurrences()
    ]
    nc = NATS()
    nc._status = NATS.CONNECTED
    nc._max_payload = 1 << 20

    def messages() -> list[Message]:
        return [
            (e.subject, e.payload, "", atomic_batch_headers(e.headers, "b" * 32, seq, commit=False))
            for seq, e in enumerate(events, start=1)
        ]

    async def one_by_one() -> None:
        for subject, payload, reply, headers in messages():
            await nc.publish(subject, payload, reply=reply, headers=headers)

    def run(batch: Callable[[], Any]) -> Callable[[], object]:
        def once() -> object:
            loop.run_until_complete(batch())
            nc._pending.clear()
            nc._pending_data_size = 0
            return None

        return once

    return {
        "nats-py": {"publish": run(one_by_one)},
        "publish_all": {"publish": run(lambda: publish_all(nc, messages()))},
    }


def contract_at(rev: str) -> types.ModuleType:
    """worker/contract.py at a git revision (standard library only, so it loads alone)."""
    return module_of(source_at(rev, "worker/contract.py"), f"{rev}:worker/contract.py", f"_contract_at_{rev}")


def measure(versions: dict[str, types.ModuleType], calls: int, repeat: int) -> dict[str, Any]:
    """Best-of-`repeat` nanoseconds per call of each case and version; versions take turns."""
    loops = max(1, calls // BATCH)
    loop = asyncio.new_event_loop()
    built = {v: cases(m) for v, m in versions.items()} | publish_cases(loop)
    best: dict[str, float] = {}
    for _ in range(repeat):
        for version, fns in built.items():
            for case, fn in fns.items():
                key = f"{case}_ns@{version}"
                seconds = timeit.timeit(fn, number=loops)
                best[key] = min(best.get(key, seconds), seconds)
    loop.close()
    return {k: round(s / (loops * BATCH) * 1e9, 1) for k, s in best.items()}


def main(argv: list[str] | None = None) -> int:
    p = parser(PROG, __doc__)
    p.add_argument("--calls", type=int, default=100_000, help="calls per round (default 100,000)")
    p.add_argument("--repeat", type=int, default=15, help="rounds; the best counts (default 15)")
    p.add_argument("--against", metavar="REV", help="also time worker/contract.py at this git revision")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not positive(PROG, args, "--calls", "--repeat"):
        return 2
    versions = {"this": worker.contract}
    if args.against:
        try:
            versions[args.against] = contract_at(args.against)
        except ValueError as exc:
            print(f"{PROG}: {exc}", file=sys.stderr)
            return 2
    report: dict[str, Any] = {"calls_per_round": args.calls, "rounds": args.repeat}
    report |= around_loop(lambda: measure(versions, args.calls, args.repeat))
    result = {k: v for k, v in report.items() if "_ns@" in k}
    ratios = {
        "publish_publish_all/nats-py": round(
            result["publish_ns@publish_all"] / result["publish_ns@nats-py"], 3
        )
    }
    if args.against:
        for case in ("firing_id", "due_event"):
            ratios[f"{case}_this/{args.against}"] = round(
                result[f"{case}_ns@this"] / result[f"{case}_ns@{args.against}"], 3
            )
    report |= ratios
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"{PROG}: best of {args.repeat} rounds of {args.calls:,} calls; "
            f"cpu loop {report['cpu_loop_ms'][0]:.0f} ms before, {report['cpu_loop_ms'][1]:.0f} ms after"
        )
        for k, v in result.items():
            print(f"  {k}: {v:,.0f} ns per call")
        for k, v in ratios.items():
            print(f"  {k}: {v:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
