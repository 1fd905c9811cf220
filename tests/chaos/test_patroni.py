"""The service under a real failover manager: a three-member Patroni cluster (tests/chaos/patroni.py,
Raft, `synchronous_mode`), the replicas on a multi-host URL (`target_session_attrs=read-write`),
never restarted. Mid-run the leader's host dies (Patroni and Postgres SIGKILLed): once its key's
ttl runs out Patroni promotes the synchronous standby, and the dead member, restarted, rejoins by
pg_rewind. Then a planned switchover moves the leader again.

Nothing is lost, early or fired twice past JetStream's dedupe; fencing tokens on the new leader go
on above every one the promoted member had; every timer ends Reached on the final leader. And the
replicas fire again within FIRING_AGAIN_S (and a multiple of the fleet's calm gap between
claims, measured before the fault) of the new leader accepting writes: their pool
reconnects within about a second (adapters/postgres/db.py), not after a back-off that doubled through the
ttl. The pauses are on the chaos summary line, and docs/OPERATIONS.md ("High availability") quotes
them.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.chaos.patroni import Member, PatroniCluster
from tests.chaos.scenario import RESULTS, Chaos, MakeRun, counting_deaths
from tests.helpers import http_get, until
from worker.devkit.embedded import free_port
from worker.service import STALLED_WRITE_S

pytestmark = pytest.mark.chaos

REPLICAS = 3
TIMERS = 3000
SPAN_S = 40.0
CRASH_AT_S = 10.0  # into the workload: timers stored, claimed, in flight
FIRING_AGAIN_S = 3.0  # from the new leader accepting writes to the replicas' first claim on it
CALM_RATIO = 5.0  # ... plus this many times the longest gap between claims before the change
LEADER_TIMEOUT_S = 60.0  # the ttl (20 s) and the promotion, on a loaded machine
POLL_S = 0.05
PAUSE_AROUND_MS = 5000  # claims this long before the fault and after the new leader bound a pause
# From the standby's promotion to every replica's /readyz saying its writes stalled: the bound
# (service.STALLED_WRITE_S) and a readiness probe's round.
STALL_SEEN_S = STALLED_WRITE_S + 10.0


@dataclass
class Change:
    """One change of leader, as seen from outside (epoch ms)."""

    what: str
    old: Member
    started_ms: int = 0  # the crash, or the switchover asked for
    leader_ms: int = 0  # another member accepted writes
    new: Member | None = None
    first_claim_ms: int = 0  # the first claim committed at or after leader_ms (database clock)
    claims_before: bool = False  # the fleet was firing when the fault came
    pause_ms: int = 0  # the longest time without a claim around the change
    calm_gap_ms: int = 0  # the longest time without a claim in the seconds before the change

    def line(self) -> str:
        return (
            f"{self.what}: to_new_leader_ms={self.leader_ms - self.started_ms} "
            f"new_leader_to_fire_ms={self.first_claim_ms - self.leader_ms} "
            f"to_fire_ms={self.first_claim_ms - self.started_ms} "
            f"pause_ms={self.pause_ms} calm_gap_ms={self.calm_gap_ms}"
        )

    def firing_again_bound_ms(self) -> float:
        """FIRING_AGAIN_S, plus CALM_RATIO times the fleet's longest gap between claims before
        the change: a loaded machine lengthens both, a back-off through the ttl (tens of
        seconds) exceeds it."""
        return FIRING_AGAIN_S * 1000 + CALM_RATIO * self.calm_gap_ms


@dataclass
class Failovers:
    """The fault driver: a leader crash, its member restarted, then a switchover."""

    cluster: PatroniCluster
    changes: list[Change] = field(default_factory=list)
    token_replicated: int = 0  # the highest lease token on the members left after the crash
    token_after: int = 0  # the first the new leader hands out

    async def __call__(self, c: Chaos) -> None:
        await c.pause(CRASH_AT_S)
        crashed = await self._leader()
        crash = Change("crash", crashed)
        self.changes.append(crash)
        with c.outage():
            crash.started_ms = now_ms()
            await asyncio.to_thread(crashed.crash)
            c.faults += 1
            # What the survivors hold: nothing more reaches them until one is promoted.
            tokens = [
                await asyncio.to_thread(_max_token, m) for m in self.cluster.members if m is not crashed
            ]
            self.token_replicated = max(tokens)
            await self._new_leader(crash)
        await asyncio.to_thread(crashed.start)  # it rejoins by pg_rewind
        await asyncio.to_thread(self.cluster.wait_healthy)
        assert crash.new is not None
        self.token_after = await asyncio.to_thread(_next_token, crash.new)
        switch = Change("switchover", crash.new)
        self.changes.append(switch)
        with c.outage():
            switch.started_ms = now_ms()
            await asyncio.to_thread(self.cluster.switchover)
            c.faults += 1
            await self._new_leader(switch)
        await asyncio.to_thread(self.cluster.wait_healthy)

    async def _leader(self) -> Member:
        leader = await until(lambda: asyncio.to_thread(self.cluster.leader), what="a leader")
        assert isinstance(leader, Member)
        return leader

    async def _new_leader(self, change: Change) -> None:
        """Until a member other than the old leader accepts writes (polled, not Patroni's word)."""

        def writable() -> Member | None:
            return next((m for m in self.cluster.members if m is not change.old and m.writable()), None)

        change.new = await until(
            lambda: asyncio.to_thread(writable),
            timeout=LEADER_TIMEOUT_S,
            what=f"a new leader after the {change.what}",
            interval=POLL_S,
        )
        change.leader_ms = now_ms()


@dataclass
class Orphan:
    """The fault driver: the leader's Patroni alone dies (on a VM without Patroni's watchdog), its
    Postgres runs on as an orphan primary that the replicas' URL still finds writable. Once the
    synchronous standby is promoted, every COMMIT on the orphan waits for a standby that left: the
    replicas must say so on /readyz. Then the orphan is stopped (what the watchdog would have
    done) and its member restarted: it rejoins by pg_rewind, dropping what it committed alone."""

    cluster: PatroniCluster
    ports: list[int]
    change: Change | None = None
    unready_ms: int = 0  # every replica's /readyz said its writes stalled
    reasons: list[str] = field(default_factory=list)

    async def __call__(self, c: Chaos) -> None:
        await c.pause(CRASH_AT_S)
        leader = await until(lambda: asyncio.to_thread(self.cluster.leader), what="a leader")
        assert isinstance(leader, Member)
        self.change = change = Change("orphan", leader)
        with c.outage():
            change.started_ms = now_ms()
            await asyncio.to_thread(leader.kill_manager)
            c.faults += 1
            await Failovers(self.cluster)._new_leader(change)
            await until(self._all_stalled, timeout=STALL_SEEN_S, what="every replica not ready", interval=0.2)
            self.unready_ms = now_ms()
            await asyncio.to_thread(leader.kill_postgres)
        await asyncio.to_thread(leader.start)
        await asyncio.to_thread(self.cluster.wait_healthy)
        await until(self._all_ready, timeout=30, what="every replica ready again", interval=0.2)

    async def _all_stalled(self) -> bool:
        answers = [await http_get(port, "/readyz") for port in self.ports]
        self.reasons = [body for _, body in answers]
        return all(code == 503 and "writes stalled" in body for code, body in answers)

    async def _all_ready(self) -> bool:
        codes = [(await http_get(port, "/readyz"))[0] for port in self.ports]
        return all(code == 200 for code in codes)


def claims_around(url: str, change: Change) -> None:
    """The first claim at or after the new leader, and the longest time without any claim from
    the fault to a few seconds after it (rows' reached_at, stamped by the database clock as a
    claim takes an occurrence; one machine, one clock)."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT (extract(epoch FROM reached_at) * 1000)::bigint FROM timers"
            " WHERE reached_at BETWEEN to_timestamp(%s / 1000.0) AND to_timestamp(%s / 1000.0)"
            " ORDER BY reached_at",
            (change.started_ms - PAUSE_AROUND_MS, change.leader_ms + PAUSE_AROUND_MS),
        ).fetchall()
    claims = [int(r[0]) for r in rows]
    change.first_claim_ms = next((ms for ms in claims if ms >= change.leader_ms), 0)
    change.claims_before = any(ms < change.started_ms for ms in claims)
    change.pause_ms = max((b - a for a, b in itertools.pairwise(claims)), default=0)
    before = [ms for ms in claims if ms < change.started_ms]
    change.calm_gap_ms = max((b - a for a, b in itertools.pairwise(before)), default=0)


def _max_token(member: Member) -> int:
    with psycopg.connect(member.url(), autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(lease_token), 0) FROM timers").fetchone()
    return int(row[0]) if row else 0


def _next_token(member: Member) -> int:
    with psycopg.connect(member.url(), autocommit=True) as conn:
        row = conn.execute("SELECT nextval('timer_lease_token')").fetchone()
    return int(row[0]) if row else 0


def now_ms() -> int:
    return round(time.time() * 1000)


async def test_leader_crash_and_switchover_under_patroni(make_run: MakeRun, tmp_path: Path) -> None:
    with PatroniCluster(tmp_path / "patroni") as cluster:
        run = make_run(
            "patroni",
            db=cluster.url,
            replicas=REPLICAS,
            variants=[{"TIMER_HTTP_PORT": str(free_port())} for _ in range(REPLICAS)],
            timers=TIMERS,
            span_s=SPAN_S,
        )
        fault = Failovers(cluster)
        driver, deaths = counting_deaths(fault)

        verdict = await run.execute(driver)
        for change in fault.changes:
            claims_around(cluster.url, change)
        line = (
            "patroni: "
            + " ".join(change.line() for change in fault.changes)
            + f" token_replicated={fault.token_replicated} token_after={fault.token_after}"
            f" replica_deaths={deaths} lost={verdict.lost} early={verdict.early}"
            f" dup_raw={verdict.dup_raw} dup_after_id={verdict.dup_after_id}"
        )
        RESULTS.append(line)
        print(line)
        assert [c.what for c in fault.changes] == ["crash", "switchover"], "the workload ended first"
        assert deaths == [0], "a replica died in a failover: it must recover without a restart"
        assert verdict.ok, "\n".join([verdict.line(), *verdict.examples])
        # Every claim committed before the crash is on the synchronous standby, and the promoted
        # member's sequence goes on above it: a fence never confuses a claim from before the
        # failover with one after.
        assert fault.token_after > fault.token_replicated > 0
        for change in fault.changes:
            assert change.claims_before, f"nothing fired before the {change.what}: it tested nothing"
            assert change.first_claim_ms, f"nothing fired after the {change.what}"
            assert change.first_claim_ms - change.leader_ms <= change.firing_again_bound_ms(), change.line()


async def test_an_orphan_primary_makes_the_replicas_unready_and_loses_nothing(
    make_run: MakeRun, tmp_path: Path
) -> None:
    """Before, /readyz stayed green through the stall (the orphan answers every read) until the
    orphan was stopped. Nothing may be lost either: a COMMIT the orphan holds is never cut short and
    taken as done (adapters/postgres/writes.py), so what it committed alone, dropped by the rewind, was
    never acknowledged."""
    with PatroniCluster(tmp_path / "patroni") as cluster:
        ports = [free_port() for _ in range(REPLICAS)]
        run = make_run(
            "patroni-orphan",
            db=cluster.url,
            replicas=REPLICAS,
            variants=[{"TIMER_HTTP_PORT": str(p)} for p in ports],
            timers=TIMERS,
            span_s=SPAN_S,
        )
        fault = Orphan(cluster, ports)
        driver, deaths = counting_deaths(fault)

        verdict = await run.execute(driver)
        change = fault.change
        assert change is not None, "the workload ended before the fault"
        line = (
            f"patroni orphan: to_new_leader_ms={change.leader_ms - change.started_ms} "
            f"new_leader_to_unready_ms={fault.unready_ms - change.leader_ms} "
            f"replica_deaths={deaths} lost={verdict.lost} early={verdict.early} "
            f"dup_raw={verdict.dup_raw} dup_after_id={verdict.dup_after_id}"
        )
        RESULTS.append(line)
        print(line)
        assert fault.unready_ms, f"a replica stayed ready over the stalled orphan: {fault.reasons}"
        assert deaths == [0], "a replica died: it must recover without a restart"
        assert verdict.ok, "\n".join([verdict.line(), *verdict.examples])
