"""A claim records its one-shot occurrences as fired in the row it leases (sql/queries.sql,
claim_due): nobody sees them fired before the batch commits, and a batch that cannot commit them
all (a failed publish, an unreadable row, a stop) rolls back and leaves every row as a lease and
its mark would have (Batch)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers import query, row, until
from tests.twins import claim_params
from worker.adapters import db
from worker.adapters.batch import release_params
from worker.adapters.queries import QUERIES
from worker.adapters.store import Store
from worker.contract import CancelTimer, Repeat, ScheduleTimer
from worker.core.domain import Fired
from worker.core.firing import next_of


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    pool = db.pool(db_url, "records", min_size=1, max_size=4, idle_in_transaction_ms=60_000)
    async with pool:
        yield Store(pool)


def timer(key: str, seconds: float, repeat: Repeat | None = None) -> ScheduleTimer:
    due = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    return ScheduleTimer("acme", key, due, None, 1, repeat)


def stored(db_url: str, key: str) -> dict[str, Any]:
    found = row(db_url, "acme", key)
    assert found is not None
    return found


def db_now(db_url: str) -> datetime:
    (now,) = query(db_url, "SELECT now()")[0]
    return now  # type: ignore[no-any-return]


async def test_nobody_sees_an_occurrence_fired_before_its_batch_commits(store: Store, db_url: str) -> None:
    await store.apply([timer("once", -1)])
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    (once,) = batch.result.claimed
    seen = stored(db_url, "once")  # another session, while the batch is in flight
    assert (seen["state"], seen["fired_count"], seen["reached_at"]) == ("Scheduled", 0, None)
    assert await batch.record([Fired(once, None, None)], []) == 1
    done = stored(db_url, "once")
    assert (done["state"], done["fired_count"], done["lease_owner"], done["lease_expires_at"]) == (
        "Reached",
        1,
        None,
        None,
    )
    # Never before its dueAt, and its claims of it counted (CONTRACT.md, attempts).
    assert done["reached_at"] >= done["due_at"] and done["attempts"] == 1 and done["last_error"] is None


async def test_an_occurrence_claimed_ahead_of_its_due_at_is_not_recorded_before_it(
    store: Store, db_url: str
) -> None:
    due = db_now(db_url) + timedelta(seconds=5)
    await store.apply([ScheduleTimer("acme", "ahead", due, None, 1, None)])
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000, ahead_ms=10_000))
    (ahead,) = batch.result.claimed
    assert await batch.record([Fired(ahead, None, None)], []) == 1
    assert stored(db_url, "ahead")["reached_at"] == due  # claimed 5 s before it came due


async def test_a_batch_with_a_failed_one_shot_rolls_back_and_records_each_row_again(
    store: Store, db_url: str
) -> None:
    hourly = Repeat("PT1H", None, None)
    await store.apply([timer("ok", -3), timer("bad", -2), timer("every", -1, hourly)])
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    ok, bad, every = batch.result.claimed
    nxt = next_of(every)
    assert nxt[0] is not None
    fired = [Fired(ok, None, None), Fired(every, *nxt)]
    assert await batch.record(fired, [(bad, "publish: TimeoutError", 60_000)]) == 2
    assert (stored(db_url, "ok")["state"], stored(db_url, "ok")["fired_count"]) == ("Reached", 1)
    moved = stored(db_url, "every")
    assert (moved["state"], moved["due_at"], moved["occurrence_index"]) == ("Scheduled", nxt[0], 1)
    failed = stored(db_url, "bad")
    assert (failed["state"], failed["fired_count"], failed["reached_at"]) == ("Scheduled", 0, None)
    assert (failed["last_error"], failed["attempts"], failed["lease_owner"]) == (
        "publish: TimeoutError",
        1,
        None,
    )
    assert failed["lease_expires_at"] > db_now(db_url) + timedelta(seconds=30)  # its back-off
    assert (await store.claim(claim_params("b", 10, lease_ms=10_000))).result.claimed == []


async def test_a_batch_that_ends_unrecorded_leaves_its_rows_claimed_not_fired(
    store: Store, db_url: str
) -> None:
    await store.apply([timer("stop", -1)])
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    await batch.close()  # a stop: its events may be out, unacknowledged
    held = stored(db_url, "stop")
    assert (held["state"], held["fired_count"], held["reached_at"]) == ("Scheduled", 0, None)
    assert (held["lease_owner"], held["lease_token"], held["attempts"]) == (
        "a",
        batch.result.claimed[0].lease_token,
        1,
    )
    assert held["lease_expires_at"] > db_now(db_url) + timedelta(seconds=20)
    other = await store.claim(claim_params("b", 10, lease_ms=10_000))
    assert other.result.claimed == []  # until the lease runs out
    await other.close()


async def test_a_row_a_command_changed_after_the_rollback_is_not_leased_again(db_url: str) -> None:
    # The claim's session ended under it (idle in its transaction past the timeout), as between a
    # batch's rollback and what it writes after: the rows are as before the claim, unleased.
    pool = db.pool(db_url, "records-frozen", min_size=1, max_size=4, idle_in_transaction_ms=500)
    async with pool:
        store = Store(pool)
        await store.apply([timer("kept", -2), timer("gone", -1)])
        batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
        kept, gone = batch.result.claimed
        await until(lambda: not query(db_url, IN_FLIGHT), what="the claim's session ended")
        assert (await store.apply([CancelTimer("acme", "gone", None, 2)])).outcomes == ["applied"]
        params = release_params([kept, gone], [None, None], [10_000, 10_000], "a")
        async with store.pool.connection() as conn:
            assert (await conn.execute(QUERIES["release_again"], params)).rowcount == 1
        await batch.close()
    assert stored(db_url, "kept")["lease_owner"] == "a"
    cancelled = stored(db_url, "gone")
    assert (cancelled["state"], cancelled["lease_owner"]) == ("Cancelled", None)


IN_FLIGHT = (
    "SELECT 1 FROM pg_stat_activity"
    " WHERE application_name = 'records-frozen' AND state = 'idle in transaction'"
)
