"""Fault injection: each scenario runs the workload on 3-5 replica processes while one kind of
fault strikes, then checks every timer (lost, early, superseded, after cancel, leased, DLQ).
One result line per scenario is printed at the end of the run; docs/RELIABILITY.md has figures."""

from __future__ import annotations

import asyncio
import glob
import signal
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from tests.chaos.cluster import NatsCluster
from tests.chaos.proxy import Proxy
from tests.chaos.scenario import Chaos, FaultDriver, Run
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres

pytestmark = pytest.mark.chaos

MakeRun = Callable[..., Run]
LEASE_MS = 3000


async def passes(run: Run, faults: FaultDriver) -> None:
    verdict = await run.execute(faults)
    assert verdict.ok, "\n".join([verdict.line(), *verdict.examples])


async def test_replicas_killed_at_random_and_at_crash_points(make_run: MakeRun) -> None:
    # Every replica may also die between claim, publish, PubAck and mark, or between an intake
    # commit and its acknowledgements (worker/core/crashpoints.py), where a timed kill seldom lands.
    crash = "claimed:0.003,published:0.005,marked:0.003,committed:0.005"
    run = make_run("kill", replicas=4, variants=[{"TIMER_TEST_CRASH": crash}])

    async def faults(c: Chaos) -> None:
        while await c.pause(c.rng.uniform(2, 4)):
            c.fleet.kill(c.victim())
            c.faults += 1

    await passes(run, faults)


async def test_a_replica_paused_past_its_lease_wakes_up_fenced(make_run: MakeRun, chaos_db: str) -> None:
    run = make_run("zombie", replicas=3, lease_ms=LEASE_MS)

    async def faults(c: Chaos) -> None:
        while await c.pause(2):
            holders = _lease_holders(chaos_db)
            name = next((n for n in c.fleet.alive() if n in holders), None)
            if name is None:
                continue
            c.fleet.signal(name, signal.SIGSTOP)
            c.faults += 1
            await asyncio.sleep(LEASE_MS / 1000 + 1.5)  # the fault itself: frozen past its lease
            c.fleet.signal(name, signal.SIGCONT)

    await passes(run, faults)


async def outages(c: Chaos, every_s: float, down: Callable[[], None], up: Callable[[], None]) -> None:
    """Take a server down every `every_s` seconds for 2 s while the workload runs; up at the end.
    `up` runs in this thread: an embedded server lives as long as the thread that started it."""
    try:
        while await c.pause(every_s):
            with c.outage():
                down()
                c.faults += 1
                await asyncio.sleep(2)  # the outage
                up()
    finally:
        up()


async def test_postgres_stopped_hard_and_restarted(make_run: MakeRun, chaos_pg: EmbeddedPostgres) -> None:
    run = make_run("postgres-down", replicas=3)
    await passes(run, lambda c: outages(c, 4, lambda: chaos_pg.stop("immediate"), chaos_pg.start))


async def test_nats_killed_and_restarted(make_run: MakeRun, chaos_nats: EmbeddedNats) -> None:
    run = make_run("nats-down", replicas=3)
    await passes(run, lambda c: outages(c, 5, chaos_nats.kill, chaos_nats.start))


async def test_replies_lost_after_the_commit_or_the_puback(
    make_run: MakeRun, chaos_db: str, chaos_pg: EmbeddedPostgres, chaos_nats: EmbeddedNats
) -> None:
    """The work is done, the answer never comes: a mark or an intake commit whose reply is cut
    after Postgres committed, a DueTimeReached whose PubAck is cut after JetStream stored it."""
    with Proxy("127.0.0.1", chaos_pg.port) as pg, Proxy("127.0.0.1", chaos_nats.port) as nats:
        run = make_run(
            "ambiguous", replica_db=pg.url_for(chaos_db), replica_nats=nats.url_for(chaos_nats.url)
        )
        cuts = [(pg, b"UPDATE "), (pg, b"COMMIT"), (nats, b'{"stream":"')]

        async def faults(c: Chaos) -> None:
            while await c.pause(1.0):
                proxy, pattern = c.rng.choice(cuts)
                proxy.cut_on_reply(pattern)
            c.faults = pg.cuts + nats.cuts

        await passes(run, faults)
        assert pg.cuts and nats.cuts, "no reply was ever cut: the scenario tested nothing"


async def test_slow_and_dropped_connections(
    make_run: MakeRun, chaos_db: str, chaos_pg: EmbeddedPostgres, chaos_nats: EmbeddedNats
) -> None:
    with Proxy("127.0.0.1", chaos_pg.port) as pg, Proxy("127.0.0.1", chaos_nats.port) as nats:
        run = make_run(
            "latency-drops", replica_db=pg.url_for(chaos_db), replica_nats=nats.url_for(chaos_nats.url)
        )

        async def faults(c: Chaos) -> None:
            for proxy in (pg, nats):
                proxy.set_latency(0.02, jitter=0.03)
            try:
                while await c.pause(3):
                    with c.outage():  # every replica's connection to it, at once
                        c.faults += c.rng.choice([pg, nats]).drop_all()
            finally:
                for proxy in (pg, nats):
                    proxy.set_latency(0)

        await passes(run, faults)


def _faketime() -> str:
    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert found, "libfaketime is missing: apt-get install libfaketime (make test installs it on Debian)"
    return found[0]


async def test_replica_clocks_off_by_thirty_seconds(make_run: MakeRun) -> None:
    lib = _faketime()
    skews = [
        {"LD_PRELOAD": lib, "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        for offset in ("+30s", "-30s")
    ]
    run = make_run("clock-skew", replicas=4, variants=skews)

    async def faults(c: Chaos) -> None:
        c.faults = len(c.fleet.alive())  # every replica's clock is off, all run long
        while await c.pause(5):
            pass

    await passes(run, faults)


async def test_a_long_transaction_holds_back_vacuum(make_run: MakeRun, chaos_db: str) -> None:
    run = make_run("long-transaction", replicas=3)

    async def faults(c: Chaos) -> None:
        with psycopg.connect(chaos_db) as conn:
            # A snapshot held open for the whole run: no row version dies while timers churn.
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            conn.execute("SELECT count(*) FROM timers")
            c.faults = 1
            while await c.pause(5):
                pass
            conn.rollback()

    await passes(run, faults)


async def test_nats_cluster_loses_its_stream_leaders(make_run: MakeRun, tmp_path: Path) -> None:
    """R3 streams on a 3-node cluster, as production runs NATS: the events stream's leader is
    killed mid-run, then the commands stream's, each restarted once another node leads."""
    with NatsCluster(tmp_path / "cluster") as cluster:
        run = make_run("nats-cluster", nats=cluster.url, replicas=3, stream_replicas=3)
        streams = [run.replica_env["TIMER_EVENT_STREAM"], run.replica_env["TIMER_COMMAND_STREAM"]]

        async def faults(c: Chaos) -> None:
            down: int | None = None
            try:
                for stream in streams:
                    # An election takes 4-7 s: both kills land while the workload is running.
                    if not await c.pause(run.workload.span_s / 7):
                        break
                    down = await asyncio.to_thread(cluster.stream_leader, stream)
                    with c.outage():  # the stream has no leader until the election
                        cluster.kill(down)
                        c.faults += 1
                        await asyncio.to_thread(cluster.wait_stream_leader_elected, stream, down)
                    cluster.restart(down)  # from this thread: the node lives as long as it
                    down = None
            finally:
                if down is not None:
                    cluster.restart(down)

        await passes(run, faults)


def _lease_holders(db_url: str) -> set[str]:
    """Replicas holding claims: committed leases, and batches in flight (a session in its claim's
    transaction, whose lease commits with the mark: application_name is the replica's name)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT lease_owner FROM timers"
            " WHERE lease_expires_at > now() AND lease_owner IS NOT NULL"
            " UNION SELECT application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
        ).fetchall()
    return {r[0] for r in rows}
