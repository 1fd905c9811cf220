"""A claim records its one-shot occurrences as fired in the row it leases (sql/queries/firing.sql,
claim_due): nobody sees them fired before the batch commits, and one that does not fire (a failed
publish, an unreadable row, a stop) is put back in the batch's transaction as a lease and its
retry would have left it (Batch, retry_later)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers import query, row
from tests.twins import claim_params
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.contract import Repeat, ScheduleTimer
from worker.core.domain import Fired
from worker.core.recurrence import next_of


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


async def test_a_batch_with_a_failed_one_shot_puts_it_back_leased_and_records_the_others(
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


async def test_a_recorded_occurrence_neither_fired_nor_failed_is_held_not_committed_fired(
    store: Store, db_url: str
) -> None:
    # Never so from the firing loop, which ends each occurrence one way or the other: the batch
    # holds such a one for a lease rather than commit it fired, unpublished.
    await store.apply([timer("lost", -1)])
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    assert await batch.record([], []) == 0
    held = stored(db_url, "lost")
    assert (held["state"], held["fired_count"], held["reached_at"]) == ("Scheduled", 0, None)
    assert held["lease_expires_at"] > db_now(db_url) + timedelta(seconds=20)


# A row holding what the claim's write of a fired one-shot occurrence would take from it: an
# earlier error, pause, firing's reachedAt or waiting commands (claim_due, `record`).
HISTORY = {
    "last_error": "'publish: TimeoutError'",
    "paused_at": "now() - interval '1 minute'",
    "reached_at": "now() - interval '1 hour'",
    "deferred_seqs": "ARRAY[7]::bigint[]",
}


@pytest.mark.parametrize("column", HISTORY)
async def test_a_one_shot_row_with_history_keeps_it_when_its_publish_fails(
    store: Store, db_url: str, column: str
) -> None:
    await store.apply([timer("old", -1)])
    query(db_url, f"UPDATE timers SET {column} = {HISTORY[column]} WHERE service_call_id = 'old'")
    before = stored(db_url, "old")
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    (old,) = batch.result.claimed
    assert await batch.record([], [(old, "publish: TimeoutError", 60_000)]) == 0
    after = stored(db_url, "old")
    assert (after["state"], after[column], after["fired_count"]) == ("Scheduled", before[column], 0)


@pytest.mark.parametrize("column", HISTORY)
async def test_a_one_shot_row_with_history_is_recorded_as_any_other_when_it_fires(
    store: Store, db_url: str, column: str
) -> None:
    await store.apply([timer("old", -1)])
    query(db_url, f"UPDATE timers SET {column} = {HISTORY[column]} WHERE service_call_id = 'old'")
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    (old,) = batch.result.claimed
    assert await batch.record([Fired(old, None, None)], []) == 1
    done = stored(db_url, "old")
    assert (done["state"], done["fired_count"], done["paused_at"], done["last_error"]) == (
        "Reached",
        1,
        None,
        None,
    )
    assert done["reached_at"] >= done["due_at"] and done["lease_expires_at"] is None
