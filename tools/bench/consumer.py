"""What a consumer of DueTimeReached costs per event: the client's `due_events` beside nats-py's
`ordered` (no acks), `push` (durable, `msg.ack()`) and `fetch` (pull, `fetch(256)`) consumers,
reading the same stored events in turns whose order rotates; nothing else runs in the process.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api

from tools.bench.report import around_loop, parser, positive
from worker.client.consumer import due_events
from worker.client.wire import publish_all
from worker.devkit.embedded import EmbeddedNats

PROG = "python -m tools.bench.consumer"
STREAM, SUBJECT = "EVENTS", "svc.*.timer.due"

Read = Callable[[NATS, int, str], Awaitable[None]]  # connection, events, a fresh consumer name
Subscribe = Callable[[Callable[[Msg], Awaitable[None]]], Awaitable[Any]]  # a callback: its subscription


def event(i: int) -> tuple[str, bytes, str, dict[str, str]]:
    """An event as a replica publishes one for an occurrence without data or carried headers."""
    event_id = str(uuid.uuid4())
    body = (
        f'{{"id":"{event_id}","type":"DueTimeReached","tenantId":"t{i % 10}","correlationId":null,'
        f'"timestampMs":1764000000000,"payload":{{"tenantId":"t{i % 10}","serviceCallId":"d-{i}",'
        f'"dueAt":"2026-11-24T12:00:00.123456Z","reachedAt":"2026-11-24T12:00:00.125000Z"}}}}'
    )
    return f"svc.t{i % 10}.timer.due", body.encode(), "", {"Nats-Msg-Id": event_id}


async def read_due_events(nc: NATS, n: int, name: str) -> None:
    got = 0
    events = due_events(
        nc.jetstream(), SUBJECT, durable=name, stream=STREAM, ack_every=256, max_ack_pending=4096
    )
    async for e in events:
        e.event  # noqa: B018  # decoded, as a handler reads it
        e.ack()
        got += 1
        if got == n:
            break
    await events.aclose()


async def _by_callback(n: int, subscribe: Subscribe, ack: bool) -> None:
    done = asyncio.Event()
    got = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal got
        json.loads(msg.data)
        if ack:
            await msg.ack()
        got += 1
        if got == n:
            done.set()

    sub = await subscribe(on_msg)
    await done.wait()
    await sub.unsubscribe()


async def read_ordered(nc: NATS, n: int, name: str) -> None:
    js = nc.jetstream()
    await _by_callback(
        n, lambda cb: js.subscribe(SUBJECT, cb=cb, ordered_consumer=True, stream=STREAM), ack=False
    )


async def read_push(nc: NATS, n: int, name: str) -> None:
    js = nc.jetstream()
    await _by_callback(
        n, lambda cb: js.subscribe(SUBJECT, durable=name, stream=STREAM, cb=cb, manual_ack=True), ack=True
    )


async def read_fetch(nc: NATS, n: int, name: str) -> None:
    sub = await nc.jetstream().pull_subscribe(SUBJECT, durable=name, stream=STREAM)
    got = 0
    while got < n:
        for msg in await sub.fetch(256, timeout=5):
            json.loads(msg.data)
            await msg.ack()
            got += 1
    await sub.unsubscribe()


READERS: dict[str, Read] = {
    "due_events": read_due_events,
    "ordered": read_ordered,
    "push": read_push,
    "fetch": read_fetch,
}


async def measure(url: str, rounds: int, n: int, readers: list[str]) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(api.StreamConfig(name=STREAM, subjects=[SUBJECT]))
    for start in range(0, n, 1000):
        *batch, (subject, body, _, headers) = [event(i) for i in range(start, min(n, start + 1000))]
        await publish_all(nc, batch)
        await js.publish(subject, body, headers=headers)  # its PubAck: the batch before it is stored too
    cpu: dict[str, list[float]] = {r: [] for r in readers}
    rate: dict[str, list[float]] = {r: [] for r in readers}
    for round_ in range(rounds):
        for reader in readers[round_ % len(readers) :] + readers[: round_ % len(readers)]:
            conn = await nats.connect(url)
            started_cpu, started = time.process_time(), time.perf_counter()
            await asyncio.wait_for(READERS[reader](conn, n, f"{reader}-{round_}"), timeout=120 + n / 1000)
            cpu[reader].append((time.process_time() - started_cpu) / n * 1e6)
            rate[reader].append(n / (time.perf_counter() - started))
            await conn.close()
            print(
                f"[consumer] round {round_ + 1}: {reader} {cpu[reader][-1]:.1f} ms CPU per 1,000",
                file=sys.stderr,
            )
    await nc.close()
    medians = {r: statistics.median(cpu[r]) for r in readers}
    base = medians.get("ordered")
    return {
        "cpu_ms_per_1k": {r: round(medians[r], 2) for r in readers},
        "cpu_ms_per_1k_runs": {r: [round(x, 2) for x in cpu[r]] for r in readers},
        "events_per_s": {r: round(statistics.median(rate[r])) for r in readers},
        "cpu_over_ordered": {r: round(medians[r] / base, 3) for r in readers} if base else {},
    }


def main(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    p = parser(PROG, __doc__)
    p.add_argument("--rounds", type=int, default=5, help="rounds; medians count (default 5)")
    p.add_argument(
        "--events", type=int, default=100_000, help="events each reader reads a round (default 100,000)"
    )
    p.add_argument(
        "--readers", nargs="+", choices=list(READERS), default=list(READERS), help="a subset (default all)"
    )
    args = p.parse_args(given)
    if not positive(PROG, args, "--rounds", "--events"):
        return 2

    def measured() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="consumer-bench-") as tmp, EmbeddedNats(Path(tmp)) as server:
            return asyncio.run(measure(server.url, args.rounds, args.events, args.readers))

    report = {"command": " ".join([PROG, *given]), "rounds": args.rounds, "events": args.events}
    print(json.dumps(report | around_loop(measured), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
