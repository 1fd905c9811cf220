"""One chaos run: replicas as real processes, the workload, a fault driver, then the check.

A run: start the fleet, send the workload while the fault driver does its worst, undo the
faults, wait (with a deadline) until every command is handled and nothing is left Scheduled or
leased, stop the fleet with SIGTERM, and check every timer (tests/chaos/checker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import psycopg

from tests.chaos.checker import Event, Row, Verdict, Window, check, lost_outside
from tests.chaos.workload import Workload, ms_of
from tests.helpers import until
from worker.contract import Subjects
from worker.core.crashpoints import CRASH_EXIT
from worker.devkit.harness import ReplicaSet
from worker.devkit.recorder import Received, Recorder

SETTLE_TIMEOUT_S = 180.0


class Fleet(ReplicaSet):
    """Replicas kept at a count, as a Deployment would: whatever dies is replaced."""

    def __init__(
        self, env: Mapping[str, str], log_dir: Path, size: int, variants: list[dict[str, str]]
    ) -> None:
        super().__init__(env, log_dir)
        self.size = size
        self.variants = variants or [{}]  # extra settings, replica after replica in turn
        self.crash_points = 0  # replicas that ended at a crash point (worker/core/crashpoints.py)
        self.deaths = 0  # every replica that died before the end, crash points included
        self.dead: set[str] = set()  # replicas that died before the end

    def replace_dead(self) -> None:
        for name, proc in list(self.procs.items()):
            if proc.poll() is not None and name not in self.dead:
                self.dead.add(name)
                self.deaths += 1
                self.crash_points += proc.returncode == CRASH_EXIT
        while len(self.alive()) < self.size:
            self.start(1, self.variants[len(self.procs) % len(self.variants)])

    def listening(self) -> bool:
        """Every live replica is past setting its SIGTERM handler (it logged http_listening, in
        Replica.run): before that, a SIGTERM ends the process by the signal (-15), not a drain."""
        return all(
            '"action": "http_listening"' in (self.log_dir / f"{name}.log").read_text(errors="replace")
            for name in self.alive()
        )

    def fence_rejections(self) -> int:
        """Records the fence turned away (a replica that lost its lease), from the replicas' logs."""
        total = 0
        for log in self.log_dir.glob("replica-*.log"):
            for line in log.read_text(errors="replace").splitlines():
                if '"action": "fence_rejected"' in line:
                    total += json.loads(line).get("count", 1)
        return total


@dataclass
class Chaos:
    """What a fault driver may touch, and what it did."""

    fleet: Fleet
    over: asyncio.Event  # set once the whole workload is stored
    rng: random.Random = field(default_factory=lambda: random.Random(11))
    faults: int = 0
    outages: list[tuple[int, int]] = field(default_factory=list)  # epoch ms: Postgres or NATS down

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Record the time inside as an outage of Postgres or NATS (every replica cut off): the
        only time the checker lets a recurring timer skip an occurrence. A crash is not one."""
        start = round(time.time() * 1000)
        try:
            yield
        finally:
            self.outages.append((start, round(time.time() * 1000)))

    def victim(self) -> str:
        return self.rng.choice(self.fleet.alive())

    async def pause(self, seconds: float) -> bool:
        """Sleep while the workload runs; False once it is over (time to undo the faults)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.over.wait(), timeout=seconds)
        return not self.over.is_set()


FaultDriver = Callable[[Chaos], Coroutine[Any, Any, None]]


@dataclass
class Run:
    name: str
    db_url: str  # the test's database, direct (the checker reads it)
    nats_url: str  # direct, for the workload and the taps
    replica_env: dict[str, str]  # TIMER_* settings of the replicas (maybe through proxies)
    workdir: Path
    workload: Workload
    replicas: int = 4
    variants: list[dict[str, str]] = field(default_factory=list)  # per-replica extra settings

    async def execute(self, faults: FaultDriver, loss_window: Callable[[], Window] | None = None) -> Verdict:
        """Run the workload under `faults`, check it, print the chaos line; the verdict.

        `loss_window`: for a scenario that expects to lose commands stored in a window it knows
        only once the fault has happened (command stream sequences); the line then says
        EXPECTED-LOSS, not FAIL, when every lost timer had a command stored in it and nothing else
        went wrong (Verdict.status).
        """
        prefix = self.replica_env["TIMER_SUBJECT_PREFIX"]
        subjects = Subjects(prefix)
        events = Recorder(self.nats_url, subjects.due("*"), self.replica_env["TIMER_EVENT_STREAM"], _event)
        dlq = Recorder(
            self.nats_url, subjects.of("*", "dlq"), self.replica_env["TIMER_DLQ_STREAM"], _copy(subjects)
        )
        env = {**self.replica_env, "TIMER_LOG_FORMAT": "json"}
        with Fleet(env, self.workdir, self.replicas, self.variants) as fleet:
            fleet.replace_dead()
            await self._streams_ready()
            await events.start()
            await dlq.start()
            over = asyncio.Event()
            chaos = Chaos(fleet, over)
            driver = asyncio.create_task(faults(chaos))
            keeper = asyncio.create_task(self._keep(fleet, over))
            started = time.monotonic()
            try:
                await self.workload.run(self.nats_url, prefix)
            finally:
                over.set()
                await driver  # it undoes its faults once the workload is over
                await keeper
            fleet.replace_dead()
            await self._settle(fleet, events, dlq)
            # A replica started late (replacing a dead one) may still be importing.
            await until(fleet.listening, what="every live replica up")
            codes = fleet.terminate_all(timeout=30)
            await events.stop()
            await dlq.stop()
            verdict = check(
                self.workload.timers,
                events.records,
                self._rows(),
                dlq.records,
                self.workload.poison,
                chaos.outages,
            )
            outside = (
                None if loss_window is None else lost_outside(verdict, self.workload.timers, loss_window())
            )
            line = (
                f"chaos {self.name}: {verdict.status(outside)} {verdict.line()} "
                f"faults={chaos.faults} replica_deaths={fleet.deaths} crash_points={fleet.crash_points} "
                f"fence_rejected={fleet.fence_rejections()} command_retries={self.workload.publish_retries} "
                f"seconds={time.monotonic() - started:.0f}"
            )
            RESULTS.append(line)
            print(line)
            live_codes = {n: c for n, c in codes.items() if n not in fleet.dead}
            assert set(live_codes.values()) <= {0}, f"replicas did not stop cleanly: {live_codes}"
            return verdict

    async def _keep(self, fleet: Fleet, over: asyncio.Event) -> None:
        while not over.is_set():
            fleet.replace_dead()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(over.wait(), timeout=0.2)

    async def _streams_ready(self) -> None:
        """The shared command consumer exists: a replica connected and set the streams up."""
        stream, consumer = self.replica_env["TIMER_COMMAND_STREAM"], self.replica_env["TIMER_CONSUMER"]
        nc = await nats.connect(self.nats_url.split(","))

        async def consumer_exists() -> bool:
            try:
                await nc.jetstream().consumer_info(stream, consumer)
            except (nats.js.errors.NotFoundError, nats.errors.TimeoutError):
                return False
            return True

        try:
            await until(consumer_exists, timeout=60, what="a replica to set the streams up")
        finally:
            await nc.close()

    async def _settle(self, fleet: Fleet, events: Recorder[Event], dlq: Recorder[Copy]) -> None:
        """Until every command is handled, nothing is Scheduled or leased, every Reached row's
        firing and every poison copy has arrived; or the deadline (the check then says what)."""
        stream, consumer = self.replica_env["TIMER_COMMAND_STREAM"], self.replica_env["TIMER_CONSUMER"]
        nc = await nats.connect(self.nats_url.split(","), max_reconnect_attempts=-1)
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        try:
            while time.monotonic() < deadline:
                fleet.replace_dead()
                with contextlib.suppress(nats.errors.Error, TimeoutError):
                    info = await nc.jetstream().consumer_info(stream, consumer)
                    commands_left = info.num_pending + info.num_ack_pending
                    if commands_left == 0 and self._quiet(events, dlq):
                        return
                await asyncio.sleep(0.25)
        finally:
            await nc.close()

    def _quiet(self, events: Recorder[Event], dlq: Recorder[Copy]) -> bool:
        rows = self._rows()
        if any(r.state == "Scheduled" or r.leased for r in rows.values()):
            return False
        fired = {(e.key, e.due_ms) for e in events.records}
        reached = {(k, r.due_ms) for k, r in rows.items() if r.state == "Reached"}
        return reached <= fired and len({body for _, body in dlq.records}) >= len(self.workload.poison)

    def _rows(self) -> dict[tuple[str, str], Row]:
        with psycopg.connect(self.db_url, autocommit=True) as conn:
            cur = conn.execute(
                "SELECT tenant_id, service_call_id, state, "
                "(extract(epoch FROM due_at) * 1000)::bigint, lease_expires_at IS NOT NULL FROM timers"
            )
            return {(t, s): Row(state, due, leased) for t, s, state, due, leased in cur.fetchall()}


Copy = tuple[str, bytes]  # a DLQ copy: (its subject's tenant token, the command's body)


def _copy(subjects: Subjects) -> Callable[[float, Received], Copy]:
    def keep(_received: float, msg: Received) -> Copy:
        where = subjects.split(msg.subject)
        assert where is not None, msg.subject  # the DLQ stream only binds <prefix>.*.timer.dlq
        return where[0], msg.data

    return keep


def _event(received: float, msg: Received) -> Event:
    body = json.loads(msg.data)
    p = body["payload"]
    return Event(
        body["id"],
        (p["tenantId"], p["serviceCallId"]),
        ms_of(p["dueAt"]),
        ms_of(p["reachedAt"]),
        int(received * 1000),
    )


RESULTS: list[str] = []  # one line per scenario, printed again at the end of the session

MakeRun = Callable[..., Run]  # the make_run fixture (tests/chaos/conftest.py)


async def passes(run: Run, faults: FaultDriver) -> None:
    """Run it under `faults`; every timer as the checker wants it."""
    verdict = await run.execute(faults)
    assert verdict.ok, "\n".join([verdict.line(), *verdict.examples])


def scale() -> float:
    """TIMER_CHAOS_SCALE multiplies timers and duration: 1 in `make test`, more for a soak."""
    return float(os.environ.get("TIMER_CHAOS_SCALE", "1"))


def counting_deaths(fault: FaultDriver) -> tuple[FaultDriver, list[int]]:
    """A driver that runs `fault`, and the list its run fills with the replica deaths it saw (one
    entry, once the fault's driver ended whatever happened)."""
    deaths: list[int] = []

    async def driver(c: Chaos) -> None:
        try:
            await fault(c)
        finally:
            deaths.append(c.fleet.deaths)

    return driver, deaths
