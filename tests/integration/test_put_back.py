"""A one-shot occurrence its claim recorded as fired and then put back (a failed publish, an
unreadable row, a stop: Batch, sql/queries/firing.sql retry_later) is left, column for column, as a lease
and its retry leave an occurrence that was never recorded."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers import query, until
from tests.twins import claim_params
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.contract import PauseTimers, Repeat, ScheduleTimer
from worker.core.domain import Claimed, Fired, Leased
from worker.core.ports import ClaimedBatch
from worker.core.recurrence import next_of
from worker.ops import reads

# What a claim's lease and then retry_later (or a stop's commit) change on a row: nothing else.
LEASE_COLUMNS = {"lease_owner", "lease_token", "lease_expires_at", "attempts", "claimed_at", "last_error"}
# A put-back row's updated_at is when it was claimed (sql/queries/firing.sql, retry_later): the value it
# had is gone with the claim's write. Known and accepted; checked apart below.
PUT_BACK_COLUMNS = LEASE_COLUMNS | {"updated_at"}
BACKOFF_MS = 1_000  # a failed publish's (end): short, for tests that wait for it to run out


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    pool = db.pool(db_url, "put-back", min_size=1, max_size=4, idle_in_transaction_ms=60_000)
    async with pool:
        yield Store(pool)


def timer(key: str, seconds: float) -> ScheduleTimer:
    due = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    return ScheduleTimer("acme", key, due, None, 1, None)


def stored(db_url: str, key: str) -> dict[str, Any]:
    """Every column, as JSON (a dueAt of -infinity too, which Python cannot hold)."""
    sql = "SELECT to_jsonb(t) FROM timers t WHERE tenant_id = 'acme' AND service_call_id = %s"
    found = query(db_url, sql, key)
    assert len(found) == 1
    return found[0][0]  # type: ignore[no-any-return]


def changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {c for c in before if before[c] != after[c]}


async def end(batch: ClaimedBatch, how: str) -> None:
    """End the batch as a failed publish of every row, or as a stop."""
    if how == "failed":
        held: list[Leased] = [*batch.result.claimed, *batch.result.unreadable]
        assert await batch.record([], [(h, "publish: TimeoutError", BACKOFF_MS) for h in held]) == 0
    else:
        await batch.close()


@pytest.mark.parametrize("how", ["failed", "stop"])
async def test_a_put_back_row_changes_only_what_a_lease_changes_on_a_row_never_recorded(
    store: Store, db_url: str, how: str
) -> None:
    # "leased": a one-shot row with an earlier error, which the claim leases (claim_due): the
    # lease path, the reference. "recorded": a clean one, which the claim writes Reached.
    await store.apply([timer("recorded", -2), timer("leased", -2)])
    query(db_url, "UPDATE timers SET last_error = 'earlier' WHERE service_call_id = 'leased'")
    before = {k: stored(db_url, k) for k in ("recorded", "leased")}
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    assert len(batch.result.claimed) == 2
    await end(batch, how)
    after = {k: stored(db_url, k) for k in ("recorded", "leased")}
    assert changed(before["leased"], after["leased"]) <= LEASE_COLUMNS  # the reference holds
    assert changed(before["recorded"], after["recorded"]) <= PUT_BACK_COLUMNS
    for column in ("lease_owner", "lease_token", "attempts", "claimed_at"):
        assert after["recorded"][column] == after["leased"][column], column
    if how == "stop":  # both held by the claim's own lease, which the other row committed as is
        assert after["recorded"]["lease_expires_at"] == after["leased"]["lease_expires_at"]


async def test_a_stop_late_in_a_batch_holds_its_recorded_rows_no_longer_than_the_claims_lease(
    store: Store, db_url: str
) -> None:
    # A batch stopped a while after its claim (its publishes slow): the rows it leased run out when
    # the claim's lease does, and so must those it had recorded and puts back; held a lease from
    # the stop, they would fire that much later than their neighbours, and than the lease promises.
    await store.apply([timer("recorded", -2), timer("leased", -2)])
    query(db_url, "UPDATE timers SET last_error = 'earlier' WHERE service_call_id = 'leased'")
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    claimed_at = batch.result.db_now
    await until(
        lambda: query(db_url, "SELECT clock_timestamp() > %s + interval '1 second'", claimed_at)[0][0],
        what="the database clock a second past the claim",
    )
    await batch.close()
    expiry = "SELECT lease_expires_at FROM timers WHERE service_call_id = %s"
    (held,) = query(db_url, expiry, "recorded")[0]
    (leased,) = query(db_url, expiry, "leased")[0]
    assert leased <= claimed_at + timedelta(seconds=30)
    assert held == leased


async def test_an_unreadable_row_put_back_changes_only_what_a_lease_changes(
    store: Store, db_url: str
) -> None:
    await store.apply([timer("minus", -2)])
    query(db_url, "UPDATE timers SET due_at = '-infinity' WHERE service_call_id = 'minus'")
    before = stored(db_url, "minus")
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    assert [u.service_call_id for u in batch.result.unreadable] == ["minus"]
    await end(batch, "failed")
    assert changed(before, stored(db_url, "minus")) <= PUT_BACK_COLUMNS


@pytest.mark.parametrize("how", ["failed", "stop"])
async def test_describe_shows_a_put_back_row_as_the_lease_path_leaves_one(
    store: Store, db_url: str, how: str
) -> None:
    # `timer-service describe` (reads.py) of the two rows of the first test: the same view, but
    # for what names the row and updatedAt (see PUT_BACK_COLUMNS).
    await store.apply([timer("recorded", -2), timer("leased", -2)])
    query(db_url, "UPDATE timers SET last_error = 'earlier' WHERE service_call_id = 'leased'")
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    await end(batch, how)
    with reads.connect(db_url) as conn:
        views = {k: reads.describe(conn, "acme", k) for k in ("recorded", "leased")}
    recorded, leased = views["recorded"], views["leased"]
    assert recorded is not None and leased is not None
    own = {"serviceCallId", "updatedAt"} | ({"lastError"} if how == "stop" else set())
    assert {k: v for k, v in recorded.items() if k not in own} == {
        k: v for k, v in leased.items() if k not in own
    }
    assert (recorded["state"], recorded["reachedAt"], recorded["occurrencesFired"]) == ("Scheduled", None, 0)
    assert recorded["lastError"] == ("publish: TimeoutError" if how == "failed" else None)


async def claim_again(store: Store, db_url: str, key: str) -> tuple[ClaimedBatch, Claimed]:
    """Once `key`'s lease (a back-off, a stop's) ran out on the database clock, claim it."""
    expired = "SELECT lease_expires_at < now() FROM timers WHERE service_call_id = %s"
    await until(lambda: query(db_url, expired, key)[0][0], what=f"{key}'s lease ran out")
    batch = await store.claim(claim_params("b", 10, lease_ms=10_000))
    (again,) = batch.result.claimed
    return batch, again


@pytest.mark.parametrize("how", ["failed", "stop"])
@pytest.mark.parametrize("repeat", [None, Repeat("PT1S", 2, None)], ids=["one-shot", "last-of-two"])
async def test_a_last_occurrence_put_back_then_fired_keeps_the_claims_that_fired_it(
    store: Store, db_url: str, how: str, repeat: Repeat | None
) -> None:
    # docs/CONTRACT.md, attempts: a Reached timer keeps the count of claims that fired its last
    # occurrence, the put-back one counted; nothing of the failure stays.
    due = (datetime.now(UTC) - timedelta(seconds=3)).replace(microsecond=0)  # no downtime: both due
    await store.apply([ScheduleTimer("acme", "last", due, None, 1, repeat)])
    if repeat is not None:  # the first of two fires as it should
        batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
        (first,) = batch.result.claimed
        assert await batch.record([Fired(first, *next_of(first))], []) == 1
    batch = await store.claim(claim_params("a", 10, lease_ms=1_000))
    (last,) = batch.result.claimed
    assert last.attempts == 1 and next_of(last) == (None, None)
    if how == "failed":
        assert await batch.record([], [(last, "publish: TimeoutError", 50)]) == 0
    else:
        await batch.close()
    batch, again = await claim_again(store, db_url, "last")
    assert again.attempts == 2
    assert await batch.record([Fired(again, None, None)], []) == 1
    done = query(
        db_url,
        "SELECT state, attempts, fired_count, last_error, lease_owner, lease_expires_at, reached_at >= due_at"
        " FROM timers WHERE service_call_id = 'last'",
    )
    assert done == [("Reached", 2, 1 if repeat is None else 2, None, None, None, True)]


@pytest.mark.parametrize("how", ["failed", "stop"])
async def test_a_row_claimed_ahead_and_put_back_was_not_updated_in_the_future(
    store: Store, db_url: str, how: str
) -> None:
    # The claim writes a recorded row's updatedAt as its reachedAt, never before its dueAt, which a
    # claim ahead has not reached yet; put back, the row is Scheduled and `describe` shows it.
    (now,) = query(db_url, "SELECT now()")[0]
    await store.apply([ScheduleTimer("acme", "ahead", now + timedelta(seconds=30), None, 1, None)])
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000, ahead_ms=60_000))
    (ahead,) = batch.result.claimed
    await end(batch, how)
    with reads.connect(db_url) as conn:
        view = reads.describe(conn, "acme", "ahead")
    assert view is not None and view["state"] == "Scheduled" and view["reachedAt"] is None
    (updated, future) = query(
        db_url, "SELECT updated_at, updated_at > now() FROM timers WHERE service_call_id = 'ahead'"
    )[0]
    assert not future, f"updatedAt {updated} is ahead of the database clock; dueAt {ahead.due_at}"


@pytest.mark.parametrize("how", ["failed", "stop"])
async def test_a_timers_pause_sent_while_its_occurrence_is_in_flight_and_put_back_lets_it_fire_once(
    store: Store, db_url: str, how: str
) -> None:
    # The pause meets the batch in flight (deferred, nothing written), then the row put back and
    # leased: it records its pause on the claimed row, which fires once and ends unpaused (a
    # finished timer's pause ends, record_fired), as a lease-path row does.
    await store.apply([timer("paused", -2)])
    batch = await store.claim(claim_params("a", 10, lease_ms=1_000))
    pause = PauseTimers("acme", "paused", False)
    assert (await store.pause(pause)).outcomes == ["deferred"]
    assert stored(db_url, "paused")["paused_at"] is None
    await end(batch, how)
    assert (await store.pause(pause)).outcomes == ["applied"]
    held = stored(db_url, "paused")
    assert (held["state"], held["fired_count"], held["reached_at"]) == ("Scheduled", 0, None)
    assert held["paused_at"] is not None  # recorded on the claimed row: not recorded at the next claim
    again_batch, again = await claim_again(store, db_url, "paused")
    assert await again_batch.record([Fired(again, None, None)], []) == 1
    done = stored(db_url, "paused")
    assert (done["state"], done["fired_count"], done["paused_at"], done["attempts"]) == (
        "Reached",
        1,
        None,
        2,
    )
    after = await store.claim(claim_params("c", 10, lease_ms=10_000, ahead_ms=3_600_000))
    assert after.result.claimed == []  # fired once, nothing left to claim
