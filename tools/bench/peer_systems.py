"""What `make bench-peers` measures of each system (Meter: CPU by component and WAL from the first
receive to the last), and the systems on NATS: this service through a JetStream consumer in this
process, as a user's would be, and NATS message schedules through a consumer of their target."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast

import nats
import psycopg
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from tools.bench.rig import WAL_LSN_SQL, Progress, Rig, admin, proc_table, tree_cpu_s
from tools.bench.shapes import SHAPES, TIMERS, add_timers, build
from worker.client.consumer import DueEvent
from worker.contract import Subjects
from worker.devkit.recorder import Recorder

Receipt = tuple[float, float]  # (due, received), epoch seconds on this machine's clock


@dataclass
class Measured:
    receipts: list[Receipt]
    cpu_s: dict[str, float]  # component -> CPU seconds between the first and the last receive
    fires_in_window: int  # receipts between those two CPU readings
    wal_bytes: float = float("nan")  # WAL Postgres wrote between those two readings
    due_pages: float = float("nan")  # heap pages the due jobs sat on before a drain


@dataclass
class Shared:
    """The servers every system shares, and where the peers are installed."""

    admin_url: str
    nats_url: str
    pg_pid: int
    nats_pid: int
    workdir: Path
    tools: Path  # node_modules and the pgqueuer venv
    progress: Progress

    def fresh_db(self) -> tuple[str, str]:
        name = f"peer_{uuid.uuid4().hex[:8]}"
        admin(self.admin_url, f'CREATE DATABASE "{name}"')
        return name, self.admin_url.rsplit("/", 1)[0] + f"/{name}"


@contextlib.contextmanager
def shared_servers(
    workdir: Path, tools: Path, progress: Progress, settings: Sequence[tuple[str, str]] = ()
) -> Iterator[Shared]:
    """One embedded Postgres (fsync on, `settings` on its command line) and one NATS for all."""
    from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres

    with (
        EmbeddedPostgres(workdir / "pg", fsync=True, settings=dict(settings)) as pg,
        EmbeddedNats(workdir / "nats", sync_always=False) as ns,
    ):
        assert pg.pid is not None and ns.pid is not None
        yield Shared(pg.url, ns.url, pg.pid, ns.pid, workdir, tools, progress)


class Meter:
    """CPU per component, and the WAL written, between the first receive and the last."""

    def __init__(self, shared: Shared, workers: Callable[[], list[int]], consumer: bool) -> None:
        self.pids = {"postgres": [shared.pg_pid], "nats": [shared.nats_pid]}
        self.consumer = consumer  # False: the peer's handler runs in its workers, not in this process
        self.workers = workers
        self.first: dict[str, float] | None = None
        self.first_count = self.first_wal = 0
        # opened now: opened at the first receive, it would stall this process's consumer
        self.db = psycopg.connect(shared.admin_url, autocommit=True)

    def wal(self) -> int:
        row = self.db.execute(WAL_LSN_SQL).fetchone()
        return int(row[0]) if row else 0

    def read(self) -> dict[str, float]:
        table = proc_table()
        cpu = {k: tree_cpu_s(v, table) for k, v in self.pids.items()}
        cpu["workers"] = tree_cpu_s(self.workers(), table)
        if self.consumer:
            cpu["consumer"] = time.process_time()  # this process alone: the servers are counted above
        return cpu

    def observe(self, count: int) -> None:
        if self.first is None and count > 0:
            self.first, self.first_count, self.first_wal = self.read(), count, self.wal()

    async def wait(
        self, count: Callable[[], int], n: int, timeout: float, progress: Progress, what: str
    ) -> None:
        deadline, shown = time.monotonic() + timeout, time.monotonic()
        while (got := count()) < n:
            self.observe(got)
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: only {got:,} of {n:,} received in {timeout:.0f} s")
            if time.monotonic() - shown > 5:
                progress(f"{what}: {got:,}/{n:,}")
                shown = time.monotonic()
            await asyncio.sleep(0.02)
        self.observe(got)

    def result(self, receipts: list[Receipt] | Callable[[], list[Receipt]]) -> Measured:
        """The CPU and WAL since the first receive; `receipts` may be made after they are read."""
        last, wal = self.read(), self.wal()
        self.db.close()
        first = self.first or last
        got = receipts() if callable(receipts) else receipts
        window = max(len(got) - self.first_count, 1)
        return Measured(got, {k: last[k] - first[k] for k in last}, window, wal - self.first_wal)


class System(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def shapes(self) -> tuple[str, ...]: ...

    async def drain(self, n: int, shape: str, big: int) -> Measured: ...

    async def lateness(self, rate: int, seconds: float) -> Measured: ...


def lead_s(n: int) -> float:
    """How far ahead the first of n timers is due: the insert or publish must be over by then."""
    return 3 + n / 5000


def drain_timeout(n: int) -> float:
    return 120 + n / 200  # pgqueuer drained scattered jobs at 400/s


@dataclass
class Ours:
    shared: Shared
    replicas: int
    push: bool = False  # a plain nats-py push consumer instead of the client's due_events
    shapes: tuple[str, ...] = SHAPES

    @property
    def name(self) -> str:
        return "timer-service-push" if self.push else "timer-service"

    def _rig(self) -> Rig:
        return Rig(self.shared.admin_url, self.shared.nats_url, self.shared.workdir)

    async def drain(self, n: int, shape: str, big: int) -> Measured:
        async with self._rig() as rig:
            pages = await asyncio.to_thread(build, shape, rig.db_url, add_timers(rig.db_url), TIMERS, n, big)
            measured = await self._measure(rig, n, None, timeout=drain_timeout(n))
            measured.due_pages = pages
            return measured

    async def lateness(self, rate: int, seconds: float) -> Measured:
        n = int(rate * seconds)
        async with self._rig() as rig:
            await rig.wait_replicas_up(rig.start_replicas(self.replicas))
            seed = rig.seed(n, start_s=lead_s(n), rate=rate, key_prefix="l-")
            return await self._measure(rig, n, seed, timeout=seconds + 120)

    async def _receive(self, rig: Rig) -> tuple[list[tuple[dict[str, Any], float]], Callable[[], Any]]:
        """(event, receive time) as they come, each decoded and acknowledged and nothing more
        until the end (the tests' recorder's bookkeeping was a fifth of a consumer's CPU)."""
        subject, stream = Subjects(rig.names["subject_prefix"]).due("*"), rig.names["event_stream"]
        if self.push:  # what most users would write with nats-py: explicit acks, a deliver group
            records: list[tuple[dict[str, Any], float]] = []

            async def on_msg(msg: Msg) -> None:
                records.append((json.loads(msg.data), time.time()))
                await msg.ack()

            sub = await rig.nc_.jetstream().subscribe(
                subject, queue="bench-push", stream=stream, cb=on_msg, manual_ack=True
            )
            return records, sub.unsubscribe
        recorder = Recorder(
            rig.nc_, subject, stream, lambda at, e: (cast(DueEvent, e).event, at), durable="bench-receiver"
        )
        await recorder.start()
        return recorder.records, recorder.stop

    async def _measure(self, rig: Rig, n: int, seed: Any, timeout: float) -> Measured:
        records, stop = await self._receive(rig)
        if seed is None:  # drain: the replicas start after the insert
            rig.start_replicas(self.replicas)
        else:
            await seed
        meter = Meter(self.shared, lambda: [p.pid for p in rig.fleet.procs.values()], consumer=True)
        first: dict[str, tuple[dict[str, Any], float]] = {}  # a redelivered event counts at its first receive
        seen = 0

        def count() -> int:
            nonlocal seen
            for event, at in records[seen:]:
                first.setdefault(event["id"], (event, at))
            seen = len(records)
            return len(first)

        try:
            await meter.wait(count, n, timeout, self.shared.progress, self.name)
        finally:
            await stop()
        return meter.result(
            lambda: [
                (datetime.fromisoformat(e["payload"]["dueAt"]).timestamp(), at) for e, at in first.values()
            ]
        )


@dataclass
class NatsSchedules:
    """JetStream message schedules (server 2.12+): one `@at` schedule per timer; the server fires it."""

    shared: Shared
    name: str = "nats-schedules"
    shapes: tuple[str, ...] = ("fresh",)  # no table: the server holds the schedules in a stream

    async def drain(self, n: int, shape: str, big: int) -> Measured:
        # the server always runs: every schedule comes due at one moment after the last is stored
        return await self._run(n, lambda i, t0: t0, timeout=120 + n / 500)

    async def lateness(self, rate: int, seconds: float) -> Measured:
        n = int(rate * seconds)
        return await self._run(n, lambda i, t0: t0 + i / rate, timeout=seconds + 120)

    async def _run(self, n: int, due: Callable[[int, float], float], timeout: float) -> Measured:
        tag = uuid.uuid4().hex[:8]
        stream, prefix = f"PEER_{tag}", f"peer{tag}"
        nc: NATS = await nats.connect(self.shared.nats_url)
        try:
            config = {
                "name": stream,
                "subjects": [f"{prefix}.sched.>", f"{prefix}.fired.>"],
                "storage": "file",
                "num_replicas": 1,
                "allow_msg_schedules": True,
            }
            reply = await nc.request(
                f"$JS.API.STREAM.CREATE.{stream}", json.dumps(config).encode(), timeout=10
            )
            if "error" in (created := json.loads(reply.data)):
                raise RuntimeError(f"nats-schedules: stream not created: {created['error']}")
            js = nc.jetstream(publish_async_max_pending=4000)
            recorder = Recorder(nc, f"{prefix}.fired.>", stream, lambda at, msg: (float(msg.data), at))
            await recorder.start()
            t0 = time.time() + lead_s(n)
            futures = []
            for i in range(n):
                at = datetime.fromtimestamp(due(i, t0), UTC).isoformat(timespec="microseconds")
                headers = {
                    "Nats-Schedule": f"@at {at.replace('+00:00', 'Z')}",
                    "Nats-Schedule-Target": f"{prefix}.fired.{i}",
                }
                futures.append(
                    await js.publish_async(f"{prefix}.sched.{i}", repr(due(i, t0)).encode(), headers=headers)
                )
            await asyncio.gather(*futures)
            if time.time() > t0:
                raise RuntimeError("nats-schedules: publishing outlasted the lead; the machine is too busy")
            meter = Meter(self.shared, lambda: [], consumer=True)
            await meter.wait(lambda: len(recorder.records), n, timeout, self.shared.progress, self.name)
            return meter.result(list(recorder.records))
        finally:
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_stream(stream)
            await nc.close()
