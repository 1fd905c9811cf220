"""Fault injection on the replicas themselves: killed (at random and at crash points), frozen past
their lease, their clocks off, a long transaction beside them. Each scenario runs the workload on
3-5 replica processes while one kind of fault strikes, then checks every timer (lost, early,
superseded, after cancel, leased, DLQ); the servers' outages are test_outages.py's, the network's
test_network.py's. One result line per scenario is printed at the end of the run;
docs/RELIABILITY.md has figures."""

from __future__ import annotations

import asyncio
import glob
import signal

import psycopg
import pytest

from tests.chaos.scenario import Chaos, MakeRun, passes

pytestmark = pytest.mark.chaos

LEASE_MS = 3000


async def test_replicas_killed_at_random_and_at_crash_points(make_run: MakeRun) -> None:
    # Every replica may also die between claim, publish, PubAck and record, or between an intake
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


def _lease_holders(db_url: str) -> set[str]:
    """Replicas holding claims: committed leases, and batches in flight (a session in its claim's
    transaction, whose lease commits with the record: application_name is the replica's name)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT lease_owner FROM timers"
            " WHERE lease_expires_at > now() AND lease_owner IS NOT NULL"
            " UNION SELECT application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND state LIKE 'idle in transaction%'"
        ).fetchall()
    return {r[0] for r in rows}
