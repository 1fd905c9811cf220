"""Postgres primary failover under load: a primary and a streaming standby (tests/chaos/pgpair.py),
the replicas on a multi-host URL (`target_session_attrs=read-write`). Mid-run the standby falls
behind for a moment, the primary's host dies (SIGKILL), and the standby is promoted, as an
operator (CloudNativePG, Patroni) does. The replicas are never restarted.

Synchronous replication: nothing is lost, early or superseded; fencing tokens go on increasing.
Asynchronous: the commands a replica acknowledged while the standby was behind are lost, and
nothing else; docs/RELIABILITY.md and docs/OPERATIONS.md say so, and how to avoid it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import nats
import psycopg
import pytest
from nats.js import api

from tests.chaos.checker import Verdict, Window, lost_outside
from tests.chaos.pgpair import PgPair
from tests.chaos.scenario import RESULTS, Chaos, MakeRun, Run, counting_deaths
from tests.helpers import http_get, until
from worker.devkit.embedded import free_port

pytestmark = pytest.mark.chaos

REPLICAS = 3
STALL_S = 1.5  # the standby is held this far behind when the primary dies
PROMOTE_AFTER_S = 2.0  # the operator's detection delay: the primary is gone, nobody leads


@dataclass
class Failover:
    """The fault driver, and what it saw (epoch ms)."""

    pair: PgPair
    ports: list[int]
    at_s: float  # into the workload
    commands: tuple[str, str, str]  # the NATS URL, command stream and consumer intake reads
    acked_seq: int = 0  # the consumer's ack floor once the standby had replayed all before it
    stored_seq: int = 0  # the command stream's last sequence when the primary died
    stalled_ms: int = 0
    killed_ms: int = 0
    promote_asked_ms: int = 0  # the standby takes writes from then on, before promote returns
    promoted_ms: int = 0
    unready_ms: int = 0  # every replica's /readyz said not ready
    ready_ms: int = 0  # every replica's /readyz said ready again
    token_replicated: int = 0  # highest lease token the standby had when promoted
    token_after: int = 0  # the first token the new primary hands out
    readiness: list[tuple[int, list[int]]] = field(default_factory=list)

    async def statuses(self) -> list[int]:
        return [(await http_get(port, "/readyz"))[0] for port in self.ports]

    async def all_ready(self, ready: bool) -> bool:
        codes = await self.statuses()
        self.readiness.append((now_ms(), codes))
        return all((code == 200) == ready for code in codes)

    async def __call__(self, c: Chaos) -> None:
        if not await c.pause(self.at_s):  # timers stored, claimed, in flight
            return
        assert await self.all_ready(True), "a replica was not ready before the fault"
        self.acked_seq = (await self._consumer()).ack_floor.stream_seq
        # What was acknowledged by then was committed, and reaches the standby: waited on, as
        # replication lags with the machine's load (a fixed second was once too short).
        await asyncio.to_thread(self.pair.wait_replayed)
        with c.outage():
            self.stalled_ms = now_ms()
            self.pair.stall_replication()
            await asyncio.sleep(STALL_S)  # the fault: the standby falls behind
            self.killed_ms = now_ms()
            self.pair.kill_primary()
            self.stored_seq = (await self._consumer()).delivered.stream_seq
            c.faults += 1
            await until(lambda: self.all_ready(False), timeout=10, what="every replica not ready")
            self.unready_ms = now_ms()
            await asyncio.sleep(max(0.0, PROMOTE_AFTER_S - (now_ms() - self.killed_ms) / 1000))
            self.token_replicated = int(
                str(self.pair.standby_reads("SELECT coalesce(max(lease_token), 0) FROM timers"))
            )
            self.promote_asked_ms = now_ms()
            await asyncio.to_thread(self.pair.promote)
            self.promoted_ms = now_ms()
        await until(lambda: self.all_ready(True), timeout=30, what="every replica ready again")
        self.ready_ms = now_ms()
        with psycopg.connect(self.pair.url, autocommit=True) as conn:
            row = conn.execute("SELECT nextval('timer_lease_token')").fetchone()
        self.token_after = int(row[0]) if row else 0
        while await c.pause(1.0):
            pass

    async def _consumer(self) -> api.ConsumerInfo:
        url, stream, consumer = self.commands
        nc = await nats.connect(url.split(","))
        try:
            return await nc.jetstream().consumer_info(stream, consumer)
        finally:
            await nc.close()

    def first_mark_after_kill_ms(self) -> int:
        """When a replica first recorded a firing on the new primary (database clock)."""
        with psycopg.connect(self.pair.url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT (extract(epoch FROM min(reached_at)) * 1000)::bigint FROM timers"
                " WHERE reached_at > to_timestamp(%s / 1000.0)",
                (self.killed_ms,),
            ).fetchone()
        return int(row[0]) if row and row[0] is not None else 0


def loss_window(fault: Failover) -> Window:
    """Which commands may have been committed on the primary alone (command stream sequences):
    those the service had not acknowledged before the standby caught up ahead of the stall, up to the last
    delivered to it when the primary died. By sequence, not by send time: commands sent before the
    stall and applied in it, late on a loaded machine, are in it."""
    return (fault.acked_seq + 1, fault.stored_seq)


def now_ms() -> int:
    return round(time.time() * 1000)


async def run_failover(make_run: MakeRun, base: Path, synchronous: bool) -> tuple[Run, Failover, Verdict]:
    mode = "sync" if synchronous else "async"
    with PgPair(base / "pg", synchronous=synchronous) as pair:
        ports = [free_port() for _ in range(REPLICAS)]
        run = make_run(
            f"failover-{mode}",
            db=pair.url,
            replicas=REPLICAS,
            variants=[{"TIMER_HTTP_PORT": str(p)} for p in ports],
        )
        commands = (run.nats_url, run.replica_env["TIMER_COMMAND_STREAM"], run.replica_env["TIMER_CONSUMER"])
        fault = Failover(pair, ports, run.workload.span_s / 2, commands)
        driver, deaths = counting_deaths(fault)

        # Asynchronous: what was committed on the primary alone, while the standby was behind.
        window = None if synchronous else (lambda: loss_window(fault))
        verdict = await run.execute(driver, window)
        firing_again = fault.first_mark_after_kill_ms()
        line = (
            f"failover {mode}: kill_to_unready_ms={fault.unready_ms - fault.killed_ms} "
            f"kill_to_promoted_ms={fault.promoted_ms - fault.killed_ms} "
            f"kill_to_ready_ms={fault.ready_ms - fault.killed_ms} "
            f"kill_to_first_mark_ms={firing_again - fault.killed_ms} "
            f"token_replicated={fault.token_replicated} token_after={fault.token_after} "
            f"replica_deaths={deaths} lost={verdict.lost}"
            + ("" if synchronous else " (asynchronous: acknowledged while the standby was behind)")
        )
        RESULTS.append(line)
        print(line)
        assert fault.killed_ms, "the workload ended before the fault: the scenario tested nothing"
        assert deaths == [0], "a replica died in the failover: it must recover without a restart"
        # Reconnected within a second (db.Refill), a replica may record before promote returns.
        assert firing_again > fault.promote_asked_ms, "nothing fired on the new primary"
        # Every claim committed before the kill (all of them, when synchronous) is on the
        # standby; the promoted standby's sequence goes on above them, so a fence never confuses
        # a claim made after the failover with one made before.
        assert fault.token_after > fault.token_replicated > 0
        return run, fault, verdict


async def test_primary_killed_synchronous_standby_promoted(make_run: MakeRun, tmp_path: Path) -> None:
    _, _, verdict = await run_failover(make_run, tmp_path, synchronous=True)
    assert verdict.ok, "\n".join([verdict.line(), *verdict.examples])


async def test_primary_killed_asynchronous_standby_promoted(make_run: MakeRun, tmp_path: Path) -> None:
    """What asynchronous replication loses, exactly: commands acknowledged while the standby was
    behind (their commit was on the primary alone). Nothing else goes wrong: a firing whose record
    was lost fires again with the same Nats-Msg-Id, and JetStream drops the copy."""
    run, fault, v = await run_failover(make_run, tmp_path, synchronous=False)
    assert v.lost > 0, "the standby was never behind: the scenario tested nothing"
    outside = lost_outside(v, run.workload.timers, loss_window(fault))
    assert not outside, (
        f"lost timers none of whose commands was sent while the standby was behind: {outside[:5]}"
    )
    assert v.clean_but_lost, "\n".join([v.line(), *v.examples])
    # What the chaos line printed: the expected loss, not a failure.
    assert v.status(outside).startswith("EXPECTED-LOSS "), v.status(outside)
