"""A claim keeps the lock of a row it rechecked and left out (sql/queries/firing.sql, claim_due and
lock_keys): another batch committed the row between the claim's snapshot and its lock, so
Postgres (READ COMMITTED) locked the row's newest version, found it no longer due, and holds the
lock until the claim's batch ends. A command for that timer must not wait a lease for it, as it
would for an occurrence the batch fires; one for a row the batch did claim still does."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import psycopg
import pytest

from tests.helpers import query, until
from tests.twins import claim_params
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.contract import CancelTimer, Repeat, ScheduleTimer
from worker.core.domain import Fired
from worker.core.recurrence import next_of

# A claim takes its fencing token from this sequence before it locks any row (claim_due's token
# CTE is the outer side of the UPDATE's join in its plan; if that changed, the claim would skip the
# row and the test says so). A lock queued on the sequence behind a batch in flight, which holds it
# since its own claim, stops the next claim there with its snapshot already taken.
TOKEN_SEQUENCE = "timer_lease_token"


def waiting_on_a_lock(db_url: str, application_name: str) -> bool:
    """Whether a session of this database named `application_name` waits on a lock."""
    return bool(
        query(
            db_url,
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND application_name = %s",
            application_name,
        )
    )


def row_locked(db_url: str, key: str) -> bool:
    """Whether another session holds `key`'s row locked (a lock that NOWAIT cannot take)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        try:
            conn.execute(
                "SELECT 1 FROM timers WHERE tenant_id = 'acme' AND service_call_id = %s FOR UPDATE NOWAIT",
                (key,),
            )
        except psycopg.errors.LockNotAvailable:
            return True
    return False


@pytest.fixture
async def second_store(db_url: str) -> AsyncIterator[Store]:
    """Another replica's Store: its claim runs beside the `store` fixture's batch."""
    pool = db.pool(db_url, "recheck", min_size=1, max_size=2, idle_in_transaction_ms=60_000)
    async with pool:
        yield Store(pool)


async def test_a_command_is_not_deferred_a_lease_behind_a_claim_that_left_its_row_out(
    store: Store, second_store: Store, db_url: str
) -> None:
    (db_now,) = query(db_url, "SELECT now()")[0]
    every_minute = Repeat("PT1M", None, None)
    await store.apply([ScheduleTimer("acme", "rec", db_now - timedelta(seconds=1), None, 1, every_minute)])
    first = await store.claim(claim_params("a", 10, lease_ms=60_000))  # A's batch, held open
    (rec,) = first.result.claimed
    # Due now, after A's claim: what B's claim takes, so B's batch stays open (one that takes
    # nothing commits at once).
    await store.apply([ScheduleTimer("acme", "one", db_now - timedelta(seconds=1), None, 1, None)])

    gated = psycopg.AsyncConnection.connect(db_url, autocommit=True, application_name="gate")
    async with await gated as gate:
        await gate.execute("BEGIN")
        # Waits for A's transaction (its claim used the sequence); B's claim then waits behind it.
        alter = asyncio.create_task(gate.execute(f"ALTER SEQUENCE {TOKEN_SEQUENCE} INCREMENT BY 1"))
        await until(lambda: waiting_on_a_lock(db_url, "gate"), what="the gate queued behind A")
        claiming = asyncio.create_task(second_store.claim(claim_params("b", 10, lease_ms=60_000)))
        await until(lambda: waiting_on_a_lock(db_url, "recheck"), what="B's claim held at the gate")
        # A records the firing: `rec` moves to its next occurrence, a minute ahead, not due.
        assert await first.record([Fired(rec, *next_of(rec))], []) == 1
        await alter
        await gate.execute("ROLLBACK")
        second = await claiming

    # B's snapshot still saw `rec` due and unleased; its lock met A's committed version, no longer
    # due: B claimed `one` alone, yet holds `rec` locked until its batch ends.
    assert [c.service_call_id for c in second.result.claimed] == ["one"]
    assert row_locked(db_url, "rec"), "B does not hold rec: claim_due no longer locks after its token?"
    held = await store.apply([CancelTimer("acme", "rec", None, 2), CancelTimer("acme", "one", None, 2)])
    # `one` is B's occurrence: its cancel waits for the firing (a lease). `rec` holds none of B's:
    # offered again soon, not a lease later.
    assert held.outcomes == ["busy", "deferred"]

    (one,) = second.result.claimed
    assert await second.record([Fired(one, None, None)], []) == 1
    assert (await store.apply([CancelTimer("acme", "rec", None, 3)])).outcomes == ["applied"]
    assert query(db_url, "SELECT state FROM timers WHERE service_call_id = 'rec'") == [("Cancelled",)]
