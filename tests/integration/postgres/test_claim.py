"""The claim (worker/adapters/postgres/claim.py; sql/queries/firing.sql, claim_due, record_fired,
retry_later): one transaction per batch from the claim to its record, its rows locked meanwhile.

In sections, each opened by what it holds: one-shot occurrences recorded as fired at the claim;
put back, as a lease, when they did not fire; a failed one beside fired ones; the lock of a row
the claim rechecked and left out; the fence (a batch that outlived its lease changes nothing); and
a batch's transaction on a bad day (its session ended after the PubAck, a slow NATS)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.chaos.proxy import Proxy
from tests.helpers import (
    commands_applied,
    insert_due,
    iso_in,
    jetstream,
    publish_raw,
    query,
    row,
    running_replica,
    until,
)
from tests.twins import claim_params
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.contract import CancelTimer, Outgoing, PauseTimers, Repeat, ScheduleTimer
from worker.core.domain import Claimed, ClaimParams, Fired, Leased, Position
from worker.core.ports import ClaimedBatch
from worker.core.recurrence import next_of
from worker.errors import TransientError
from worker.ops import reads
from worker.service import Replica


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """A Store whose batches Postgres leaves open a minute: the tests end them."""
    pool = db.pool(db_url, "claim", min_size=1, max_size=4, idle_in_transaction_ms=60_000)
    async with pool:
        yield Store(pool)


def timer(key: str, seconds: float, repeat: Repeat | None = None, tenant: str = "acme") -> ScheduleTimer:
    due = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    return ScheduleTimer(tenant, key, due, None, 1, repeat)


def stored(db_url: str, key: str, tenant: str = "acme") -> dict[str, Any]:
    found = row(db_url, tenant, key)
    assert found is not None
    return found


def by_key(batch: ClaimedBatch) -> dict[str, Claimed]:
    return {c.service_call_id: c for c in batch.result.claimed}


async def claim_again(
    store: Store, db_url: str, key: str, tenant: str = "acme"
) -> tuple[ClaimedBatch, Claimed]:
    """Once `key`'s lease (its back-off, a stop's) ran out on the database clock, claim it."""
    expired = "SELECT lease_expires_at < now() FROM timers WHERE tenant_id = %s AND service_call_id = %s"
    await until(lambda: query(db_url, expired, tenant, key)[0][0], what=f"{key}'s lease ran out")
    batch = await store.claim(claim_params("b", 10, lease_ms=10_000))
    return batch, by_key(batch)[key]


def waiting_on_a_lock(db_url: str, application_name: str | None = None) -> bool:
    """Whether a session of this database (named `application_name`, when given) waits on a lock."""
    sql = "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    if application_name is None:
        return bool(query(db_url, sql))
    return bool(query(db_url, sql + " AND application_name = %s", application_name))


# Recorded at claim
#
# A claim records its one-shot occurrences as fired in the row it leases (sql/queries/firing.sql,
# claim_due): nobody sees them fired before the batch commits, and one that does not fire (a failed
# publish, an unreadable row, a stop) is put back in the batch's transaction as a lease and its
# retry would have left it (Batch, retry_later).


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


# Put back
#
# A one-shot occurrence its claim recorded as fired and then put back (a failed publish, an
# unreadable row, a stop: Batch, sql/queries/firing.sql retry_later) is left, column for column, as a lease
# and its retry leave an occurrence that was never recorded.

# What a claim's lease and then retry_later (or a stop's commit) change on a row: nothing else.
LEASE_COLUMNS = {"lease_owner", "lease_token", "lease_expires_at", "attempts", "claimed_at", "last_error"}
# A put-back row's updated_at is when it was claimed (sql/queries/firing.sql, retry_later): the value it
# had is gone with the claim's write. Known and accepted; checked apart below.
PUT_BACK_COLUMNS = LEASE_COLUMNS | {"updated_at"}
BACKOFF_MS = 1_000  # a failed publish's (end): short, for tests that wait for it to run out


def columns(db_url: str, key: str) -> dict[str, Any]:
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
    before = {k: columns(db_url, k) for k in ("recorded", "leased")}
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    assert len(batch.result.claimed) == 2
    await end(batch, how)
    after = {k: columns(db_url, k) for k in ("recorded", "leased")}
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
    before = columns(db_url, "minus")
    batch = await store.claim(claim_params("a", 10, lease_ms=30_000))
    assert [u.service_call_id for u in batch.result.unreadable] == ["minus"]
    await end(batch, "failed")
    assert changed(before, columns(db_url, "minus")) <= PUT_BACK_COLUMNS


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
    assert list(by_key(batch)) == ["last"]
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
    assert columns(db_url, "paused")["paused_at"] is None
    await end(batch, how)
    assert (await store.pause(pause)).outcomes == ["applied"]
    held = columns(db_url, "paused")
    assert (held["state"], held["fired_count"], held["reached_at"]) == ("Scheduled", 0, None)
    assert held["paused_at"] is not None  # recorded on the claimed row: not recorded at the next claim
    again_batch, again = await claim_again(store, db_url, "paused")
    assert list(by_key(again_batch)) == ["paused"]
    assert await again_batch.record([Fired(again, None, None)], []) == 1
    done = columns(db_url, "paused")
    assert (done["state"], done["fired_count"], done["paused_at"], done["attempts"]) == (
        "Reached",
        1,
        None,
        2,
    )
    after = await store.claim(claim_params("c", 10, lease_ms=10_000, ahead_ms=3_600_000))
    assert after.result.claimed == []  # fired once, nothing left to claim


# A failed one-shot beside fired ones
#
# A batch whose claim recorded one-shot occurrences that did not all fire (a failed one next to
# fired ones, a stop) puts those back, leased, in its own transaction (Batch, sql/queries/firing.sql
# retry_later): what a command, a pause and the read model meet, and a row that keeps failing.


async def test_a_one_shot_fired_beside_a_failed_one_keeps_the_count_of_claims_that_fired_it(
    store: Store, db_url: str
) -> None:
    # docs/CONTRACT.md, attempts: a Reached one-shot timer keeps the count that fired it, whether
    # its batch committed as the claim wrote it or beside a failed one.
    await store.apply([timer("clean", -3)])
    clean = await store.claim(claim_params("a", 10, lease_ms=10_000))
    assert await clean.record([Fired(clean.result.claimed[0], None, None)], []) == 1
    await store.apply([timer("ok", -3), timer("bad", -2)])
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    ok, bad = by_key(batch)["ok"], by_key(batch)["bad"]
    assert await batch.record([Fired(ok, None, None)], [(bad, "publish: TimeoutError", 60_000)]) == 1
    assert (stored(db_url, "clean")["state"], stored(db_url, "clean")["attempts"]) == ("Reached", 1)
    assert (stored(db_url, "ok")["state"], stored(db_url, "ok")["attempts"]) == ("Reached", ok.attempts)


async def test_commands_to_a_batch_with_a_failed_one_shot_wait_for_it_and_meet_the_fired_timer(
    store: Store, db_url: str
) -> None:
    await store.apply([timer("ok", -3), timer("bad", -2)])
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    ok, bad = by_key(batch)["ok"], by_key(batch)["bad"]
    later = timer("ok", 60)  # a reschedule of the timer being fired
    # In flight: both wait for the batch (lock_keys), neither applies to the row as it was.
    assert (await store.apply([CancelTimer("acme", "ok", None, 2)])).outcomes == ["deferred"]
    assert (await store.apply([later])).outcomes == ["deferred"]
    assert stored(db_url, "ok")["state"] == "Scheduled"  # the read model: not fired yet
    assert await batch.record([Fired(ok, None, None)], [(bad, "publish: TimeoutError", 60_000)]) == 1
    # Back after the firing: it was recorded, so the reschedule and the cancel are ignored, and
    # the superseded dueAt does not fire a second time.
    assert (await store.apply([later])).outcomes == ["ignored"]
    assert (await store.apply([CancelTimer("acme", "ok", None, 2)])).outcomes == ["ignored"]
    fired = stored(db_url, "ok")
    assert (fired["state"], fired["due_at"], fired["fired_count"]) == ("Reached", ok.due_at, 1)
    # The failed one holds its back-off: a command to it waits for it to fire.
    assert (await store.apply([CancelTimer("acme", "bad", None, 2)])).outcomes == ["deferred"]
    assert stored(db_url, "bad")["state"] == "Scheduled"


async def test_a_one_shot_that_keeps_failing_beside_fired_ones_counts_backs_off_and_gets_stuck(
    store: Store, db_url: str
) -> None:
    stuck_after = Store(store.pool, stuck_after=timedelta(seconds=1))  # TIMER_STUCK_AFTER=1s
    await store.apply([timer("bad", -5), timer("n1", -4)])
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    bad, n1 = by_key(batch)["bad"], by_key(batch)["n1"]
    assert bad.attempts == 1
    assert await batch.record([Fired(n1, None, None)], [(bad, "bad_carried_headers", 50)]) == 1
    first = stored(db_url, "bad")
    assert (first["state"], first["attempts"], first["last_error"]) == ("Scheduled", 1, "bad_carried_headers")
    assert first["lease_expires_at"] is not None and first["lease_owner"] is None
    for n in (2, 3):
        await store.apply([timer(f"n{n}", -1)])  # a neighbour that fires beside it each time
        batch, again = await claim_again(store, db_url, "bad")
        assert again.attempts == n  # each claim counted, not reset when put back
        assert again.recurrence_ref == bad.recurrence_ref  # first claimed: where stuck counts from
        neighbours = [Fired(c, None, None) for c in batch.result.claimed if c.service_call_id != "bad"]
        assert await batch.record(neighbours, [(again, "bad_carried_headers", 50 * n)]) == len(neighbours)
        assert stored(db_url, "bad")["attempts"] == n
    # Claimed longer than TIMER_STUCK_AFTER (dueAt 5 s ago) and still not recorded: a command to
    # it is given up as timer_stuck (README, guarantees) rather than deferred for good.
    assert (await store.apply([CancelTimer("acme", "bad", None, 2)])).outcomes == ["deferred"]  # 1 h
    assert (await stuck_after.apply([CancelTimer("acme", "bad", None, 2)])).outcomes == ["stuck"]
    assert [stored(db_url, f"n{n}")["state"] for n in (1, 2, 3)] == ["Reached"] * 3


async def test_a_stop_then_commands_the_lease_defers_them_until_the_timer_fired(
    store: Store, db_url: str
) -> None:
    await store.apply([timer("stop", -1), timer("other", -1)])
    batch = await store.claim(claim_params("a", 10, lease_ms=1_000))
    await batch.close()  # a stop with one-shot occurrences in flight: put back, leased
    assert (await store.apply([timer("stop", 60)])).outcomes == ["deferred"]
    held = stored(db_url, "stop")
    assert (held["state"], held["lease_owner"], held["fired_count"]) == ("Scheduled", "a", 0)
    again, stop = await claim_again(store, db_url, "stop")  # the lease ran out
    assert stop.attempts == 2
    assert await again.record([Fired(c, None, None) for c in again.result.claimed], []) == 2
    assert (await store.apply([timer("stop", 60)])).outcomes == ["ignored"]
    assert (stored(db_url, "stop")["state"], stored(db_url, "stop")["fired_count"]) == ("Reached", 1)


async def test_a_tenants_pause_with_a_failing_batch_in_flight_waits_for_the_failed_one(
    store: Store, db_url: str
) -> None:
    hourly = ScheduleTimer("calm", "every", timer("every", -1).due_at, None, 1, Repeat("PT1H", None, None))
    await store.apply(
        [
            timer("ok", -3, tenant="calm"),
            timer("bad", -2, tenant="calm"),
            timer("later", 600, tenant="calm"),
            hourly,
        ]
    )
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000))
    ok, bad, every = by_key(batch)["ok"], by_key(batch)["bad"], by_key(batch)["every"]
    pause = PauseTimers("calm", None, False)
    assert (await store.pause(pause)).outcomes == ["deferred"]  # three rows held by the batch
    assert stored(db_url, "later", "calm")["state"] == "Paused"
    nxt = next_of(every)
    assert nxt[0] is not None
    fired = [Fired(ok, None, None), Fired(every, *nxt)]
    assert await batch.record(fired, [(bad, "publish: TimeoutError", 50)]) == 2
    assert stored(db_url, "ok", "calm")["state"] == "Reached"  # not paused after it fired
    # Recorded beside the failed one, the recurring timer's next occurrence honours the pause.
    moved = stored(db_url, "every", "calm")
    assert (moved["state"], moved["due_at"], moved["fired_count"]) == ("Paused", nxt[0], 1)
    # The failed one is claimed (its back-off): it fires before the pause is done with it.
    assert (await store.pause(pause)).outcomes == ["deferred"]
    assert stored(db_url, "bad", "calm")["state"] == "Scheduled"
    again, bad = await claim_again(store, db_url, "bad", "calm")
    assert await again.record([Fired(bad, None, None)], []) == 1
    assert (await store.pause(pause)).outcomes == ["applied"]
    assert [stored(db_url, k, "calm")["state"] for k in ("ok", "bad", "later", "every")] == [
        "Reached",
        "Reached",
        "Paused",
        "Paused",
    ]


# The recheck's lock
#
# A claim keeps the lock of a row it rechecked and left out (sql/queries/firing.sql, claim_due and
# lock_keys): another batch committed the row between the claim's snapshot and its lock, so
# Postgres (READ COMMITTED) locked the row's newest version, found it no longer due, and holds the
# lock until the claim's batch ends. A command for that timer must not wait a lease for it, as it
# would for an occurrence the batch fires; one for a row the batch did claim still does.

# A claim takes its fencing token from this sequence before it locks any row (claim_due's token
# CTE is the outer side of the UPDATE's join in its plan; if that changed, the claim would skip the
# row and the test says so). A lock queued on the sequence behind a batch in flight, which holds it
# since its own claim, stops the next claim there with its snapshot already taken.
TOKEN_SEQUENCE = "timer_lease_token"


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


# The fence
#
# The fence: a replica whose batch outlived its lease changes nothing. A batch is one transaction
# from the claim to the record (its row locks keep everyone else off); a replica frozen mid-batch has
# its session ended by idle_in_transaction_session_timeout (the lease) and its claim rolled back; a
# batch that ends unrecorded (a stop) commits its lease, which holds the rows until it runs out.


def lease_expired(db_url: str) -> bool:
    return query(db_url, "SELECT bool_and(lease_expires_at < now()) FROM timers")[0][0] is True


def in_transaction(db_url: str) -> bool:
    """A session of this database is idle in a transaction (a claim's batch in flight)."""
    return bool(
        query(
            db_url,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'",
        )[0][0]
    )


LEASE_MS = 1000  # the lease, and the pool's idle_in_transaction_session_timeout as in production


@pytest.fixture
async def fenced(db_url: str) -> AsyncIterator[Store]:
    """The replica's Store through the replica's pool (adapters/postgres/db.py), on a short lease."""
    pool = db.pool(db_url, "fencing", min_size=1, max_size=4, idle_in_transaction_ms=LEASE_MS)
    await pool.open()
    yield Store(pool)
    await pool.close()


def claim(owner: str, limit: int = 10, lease_ms: int = LEASE_MS, downtime_ms: int = 60_000) -> ClaimParams:
    return ClaimParams(owner, limit, 2, lease_ms, 0, 2000, downtime_ms)


async def test_a_batch_frozen_past_its_lease_records_nothing(fenced: Store, db_url: str) -> None:
    """A replica paused mid-batch: Postgres ends its claim's session once idle for the lease
    (idle_in_transaction_session_timeout) and rolls the claim back; the replica, waking, can
    commit nothing, and the timer is as before the claim."""
    insert_due(db_url, "paused")
    batch = await fenced.claim(claim("zombie"))
    (paused,) = batch.result.claimed
    await until(lambda: not in_transaction(db_url), what="the frozen batch's session to be ended")
    with pytest.raises(TransientError):
        await batch.record([Fired(paused, None, None)], [])
    await batch.close()
    assert query(db_url, "SELECT state, lease_owner, attempts FROM timers") == [("Scheduled", None, 0)]


async def test_a_newer_claim_takes_a_frozen_batch_and_the_frozen_one_changes_nothing(
    fenced: Store, db_url: str
) -> None:
    insert_due(db_url, "contested")
    old = await fenced.claim(claim("zombie"))
    taken: list[ClaimedBatch] = []

    async def reclaimed() -> bool:
        batch = await fenced.claim(claim("healthy", lease_ms=10_000))
        if batch.result.claimed:
            taken.append(batch)
        return bool(taken)

    await until(reclaimed, what="the frozen claim to be rolled back and the timer claimed again")
    (new,) = taken[0].result.claimed
    assert new.service_call_id == "contested" and new.lease_token > old.result.claimed[0].lease_token
    with pytest.raises(TransientError):
        await old.record([Fired(old.result.claimed[0], None, None)], [])
    assert await taken[0].record([Fired(new, None, None)], []) == 1
    assert query(db_url, "SELECT state, lease_owner FROM timers") == [("Reached", None)]


async def test_a_batch_in_flight_or_stopped_is_not_claimed_twice(fenced: Store, db_url: str) -> None:
    for i in range(50):
        insert_due(db_url, f"k{i}")
    first = await fenced.claim(claim("a", 30, lease_ms=10_000))  # in flight: its rows locked
    second = await fenced.claim(claim("b", 100, lease_ms=10_000))
    await second.close()  # stopped: its lease committed
    third = await fenced.claim(claim("c", 100, lease_ms=10_000))
    keys_a = {c.service_call_id for c in first.result.claimed}
    keys_b = {c.service_call_id for c in second.result.claimed}
    assert len(keys_a) == 30 and len(keys_b) == 20 and third.result.claimed == []
    assert sorted(keys_a | keys_b) == sorted(f"k{i}" for i in range(50))
    await first.close()


async def test_a_stopped_batch_keeps_its_claim_until_the_lease_runs_out(fenced: Store, db_url: str) -> None:
    insert_due(db_url, "stopped")
    batch = await fenced.claim(claim("stopping"))
    await batch.close()  # a stop: published or not, unrecorded
    assert query(db_url, "SELECT lease_owner, attempts FROM timers") == [("stopping", 1)]
    assert (await fenced.claim(claim("other"))).result.claimed == []
    await until(lambda: lease_expired(db_url), what="the stopped batch's lease to run out")
    again = await fenced.claim(claim("other"))
    assert [(c.service_call_id, c.attempts) for c in again.result.claimed] == [("stopped", 2)]
    await again.close()


async def test_a_recurring_timer_refired_after_a_crash_skips_no_occurrence(
    fenced: Store, db_url: str
) -> None:
    # Every second from now. A replica claims occurrence 0 at once and dies; by the time its
    # claim is rolled back and another replica fires it, occurrence 1 is due too. That is a
    # crash, not downtime: occurrence 1 must still fire next, not be skipped for occurrence 2.
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " VALUES ('acme', 'tick', 'Scheduled', now(), now(), 'PT1S')",
    )
    crashed = await fenced.claim(claim("crashed"))
    (first,) = crashed.result.claimed
    await until(lambda: not in_transaction(db_url), what="the crashed replica's claim to be rolled back")
    await until(
        lambda: query(db_url, "SELECT now() > due_at + interval '1.2 s' FROM timers")[0][0],
        what="occurrence 1 to come due",
    )
    healthy = await fenced.claim(claim("healthy", lease_ms=10_000))
    (again,) = healthy.result.claimed
    assert again.recurrence_ref == first.recurrence_ref  # counted from its own dueAt, as the first
    nxt = next_of(again)
    assert nxt == (first.due_at + timedelta(seconds=1), 1)
    assert await healthy.record([Fired(again, *nxt)], []) == 1
    assert query(db_url, "SELECT due_at, occurrence_index FROM timers") == [nxt]


def insert_tick(db_url: str, due_in_s: float) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " SELECT 'acme', 'tick', 'Scheduled', d, d, 'PT1S' FROM (SELECT now() + %s * interval '1 s') AS x(d)",
        due_in_s,
    )


async def test_an_occurrence_claimed_late_but_before_downtime_skips_nothing(
    fenced: Store, db_url: str
) -> None:
    # The replica that recorded the occurrence before this one died right after: the next claim
    # comes from another replica's poll, a poll interval (2 s) later. Not downtime, so the
    # occurrence due meanwhile is next, not skipped.
    insert_tick(db_url, -1.5)
    (late,) = (await fenced.claim(claim("healthy", lease_ms=3000, downtime_ms=5000))).result.claimed
    assert next_of(late) == (late.due_at + timedelta(seconds=1), 1)


async def test_an_occurrence_claimed_after_downtime_skips_the_missed_window(
    fenced: Store, db_url: str
) -> None:
    insert_tick(db_url, -3.5)
    (late,) = (await fenced.claim(claim("healthy", lease_ms=3000, downtime_ms=3000))).result.claimed
    (at,) = query(db_url, "SELECT now()")[0]
    nxt = next_of(late)
    assert (
        nxt[1] == 4 and nxt[0] is not None and at - timedelta(seconds=1) < nxt[0] <= at + timedelta(seconds=1)
    )


async def test_two_stops_in_a_row_skip_no_occurrence(fenced: Store, db_url: str) -> None:
    # Each stopped batch keeps the timer claimed for a lease (2 s), longer than the period. After
    # the second, occurrence 2 is overdue by more than the downtime allowance (1.5 s here), yet the
    # fleet was claiming all along: the reference carried from occurrence 0 keeps it, and 3 comes next.
    insert_tick(db_url, 0)
    stopped = await fenced.claim(claim("stopped-1", lease_ms=2000))
    await stopped.close()
    (dying,) = stopped.result.claimed
    await until(lambda: lease_expired(db_url), what="the first stopped lease to run out")
    b = await fenced.claim(claim("b", lease_ms=2000, downtime_ms=1500))
    (zero,) = b.result.claimed
    assert await b.record([Fired(zero, *next_of(zero))], []) == 1
    stopped = await fenced.claim(claim("stopped-2", lease_ms=2000, downtime_ms=1500))
    await stopped.close()
    (one,) = stopped.result.claimed
    assert one.occurrence_index == 1 and one.recurrence_ref == dying.recurrence_ref
    await until(lambda: lease_expired(db_url), what="the second stopped lease to run out")
    c = await fenced.claim(claim("c", lease_ms=2000, downtime_ms=1500))
    (again,) = c.result.claimed
    assert await c.record([Fired(again, *next_of(again))], []) == 1
    c = await fenced.claim(claim("c", lease_ms=2000, downtime_ms=1500))
    (two,) = c.result.claimed
    await c.close()
    assert query(db_url, "SELECT now() - %s > interval '1.5 s'", two.due_at) == [(True,)]
    assert next_of(two) == (dying.due_at + timedelta(seconds=3), 3)


async def test_a_hard_stop_ends_a_replica_whose_publish_hangs_and_loses_nothing(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM's hard stop bounds the exit whatever is in flight (issue 19, defect 5): a batch whose
    publish hangs is cancelled at the drain timeout; its claim commits unrecorded (the row stays
    claimed by this replica), and another replica fires it once the lease has run out."""
    drain_s = 1.0
    replica = Replica(settings.model_copy(update={"drain_timeout_ms": round(drain_s * 1000)}))
    publishing = asyncio.Event()

    async def hang(messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        publishing.set()
        await asyncio.Event().wait()  # until cancelled
        raise AssertionError("unreachable")

    monkeypatch.setattr(replica.broker, "publish_atomic", hang)
    task = asyncio.create_task(replica.run(handle_signals=False))
    try:
        await until(lambda: replica.started.is_set(), what="replica start")
        insert_due(db_url, "held")
        await until(publishing.is_set, what="the publish to hang")
        stopped = time.monotonic()
        replica.stop.set()  # what SIGTERM does
        done, _ = await asyncio.wait({task}, timeout=drain_s + 15)
        took = time.monotonic() - stopped
        assert task in done, f"still running {took:.1f}s after the stop (drain timeout {drain_s}s)"
        assert took < drain_s + 3, f"exited {took:.1f}s after the stop (drain timeout {drain_s}s)"
        assert task.result() == 0
    finally:
        await asyncio.wait_for(task, timeout=30)
    held = row(db_url, "acme", "held")
    assert held is not None
    assert (held["state"], held["lease_owner"], held["fired_count"]) == ("Scheduled", settings.worker_id, 0)
    async with running_replica(settings, worker_id="second"):
        await until(
            lambda: query(db_url, "SELECT state FROM timers") == [("Reached",)],
            what="the held occurrence fired by another replica after the lease",
        )
    async with jetstream(settings) as js:
        assert (await js.stream_info(settings.event_stream)).state.messages == 1


async def test_a_cancel_for_a_timer_whose_batch_dies_after_its_puback_comes_too_late(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replica's batch holds the claimed row locked past the PubAck; a Cancel for the timer
    arrives; then the batch dies (its session ends, as when the process is killed: Postgres rolls
    the claim back). The event is out, so the cancel came too late: the timer ends Reached, with
    one event in the stream. Intake must not wait on the batch's lock (sql/queries/intake.sql, lock_keys):
    a command that did would apply right after the rollback, to a row as if it had not fired."""
    # The lease is also the held batch's idle timeout: long enough that only the test ends it, on a
    # loaded machine too; the deferred cancel comes back after it.
    replica = Replica(settings.model_copy(update={"lease_ms": 10_000}))
    published, release = asyncio.Event(), asyncio.Event()
    publish_atomic = replica.broker.publish_atomic

    async def held(messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        results = await publish_atomic(messages, timeout)  # the PubAck: the event is in the stream
        if not published.is_set():  # the first batch only: held open past its PubAck
            assert results == [None] * len(messages)
            published.set()
            await release.wait()
        return results

    monkeypatch.setattr(replica.broker, "publish_atomic", held)
    task = asyncio.create_task(replica.run(handle_signals=False))
    try:
        await until(lambda: replica.started.is_set(), what="replica start")
        insert_due(db_url, "late")
        await until(published.is_set, what="the event published, its batch held open")
        deferred = commands_applied("cancel", "deferred")
        async with jetstream(settings) as js:
            body = {"tenantId": "acme", "serviceCallId": "late", "timestampMs": 2**40}
            await publish_raw(js, settings, "acme", "cancel", body)
        # Deferred (this fix) or waiting on the row (the shape that lets it apply after the rollback).
        await until(
            lambda: commands_applied("cancel", "deferred") > deferred or waiting_on_a_lock(db_url),
            what="intake to take the cancel",
        )
        ((killed,),) = query(
            db_url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'",
        )
        assert killed == 1, "the held batch's session was not found: nothing was tested"
        release.set()  # its record fails: the claim is gone with its session
        ignored = commands_applied("cancel", "ignored")
        await until(
            lambda: (
                commands_applied("cancel", "ignored") > ignored
                or row(db_url, "acme", "late")["state"] == "Cancelled"
            ),  # type: ignore[index]
            timeout=40,
            what="the cancel to come back and meet the timer",
        )
        assert row(db_url, "acme", "late")["state"] == "Reached"  # type: ignore[index]
    finally:
        replica.stop.set()
        await asyncio.wait_for(task, timeout=30)
    async with jetstream(settings) as js:
        assert (await js.stream_info(settings.event_stream)).state.messages == 1  # fired again: deduplicated


async def test_a_pause_of_a_timer_in_a_batch_in_flight_is_deferred_without_waiting_for_it(
    db_url: str,
) -> None:
    """As a cancel (lock_keys): a pause that waited on the batch's lock would, after a rollback
    past the PubAck, pause a timer whose event is out. It is deferred, and after the record it finds
    the timer Reached."""
    insert_due(db_url, "held")
    # Not the 1 s idle timeout of fenced's: only the test ends this batch.
    async with db.pool(db_url, "pause", min_size=1, max_size=2, idle_in_transaction_ms=60_000) as pool:
        patient = Store(pool)
        batch = await patient.claim(claim("firing", lease_ms=10_000))
        (held,) = batch.result.claimed
        # A deadline well under the idle timeout: a wait on the lock would end only with the batch.
        pause = PauseTimers("acme", "held", resume=False)
        assert (await asyncio.wait_for(patient.pause(pause), 20)).outcomes == ["deferred"]
        assert query(db_url, "SELECT state FROM timers") == [("Scheduled",)]
        assert await batch.record([Fired(held, None, None)], []) == 1
        assert (await patient.pause(pause)).outcomes == ["ignored"]
    assert query(db_url, "SELECT state FROM timers") == [("Reached",)]


# A batch on a bad day
#
# A claim batch's transaction on a bad day: its session ended after the PubAck, a slow NATS, a
# command deferred behind it. Each test failed before its fix (an adversarial review of one
# transaction per claim batch, issue 21).

# Whatever its outcome: that intake took the command is what counts.
OUTCOMES = ("applied", "ignored", "deferred", "busy", "stuck", "partial")


@contextlib.asynccontextmanager
async def first_batch_lost_after_its_puback(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[asyncio.Event, asyncio.Event]]:
    """A running replica whose first batch's session is ended right after its PubAck, and waited
    for until gone (pg_terminate_backend only signals it): its claim is rolled back. Yields
    (died, claims_open): once died is set, the replica's claims wait for claims_open."""
    replica = Replica(settings.model_copy(update={"lease_ms": 10_000}))
    died, claims_open = asyncio.Event(), asyncio.Event()
    publish_atomic = replica.broker.publish_atomic
    claim = replica.store.claim

    async def gated(params: ClaimParams) -> ClaimedBatch:
        if died.is_set():  # the next claim comes after the reschedule: a poll interval's wait
            await claims_open.wait()
        return await claim(params)

    async def dies_after_puback(messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        results = await publish_atomic(messages, timeout)
        if not died.is_set():
            assert results == [None] * len(messages)
            killed = query(
                db_url,
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'",
            )
            assert len(killed) == 1, "the batch's session was not found: nothing was tested"
            await until(
                lambda: query(db_url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", killed[0][0]) == [],
                what="the batch's session to end",
            )
            died.set()
        return results

    monkeypatch.setattr(replica.store, "claim", gated)
    monkeypatch.setattr(replica.broker, "publish_atomic", dies_after_puback)
    task = asyncio.create_task(replica.run(handle_signals=False))
    try:
        await until(lambda: replica.started.is_set(), what="replica start")
        yield died, claims_open
    finally:
        claims_open.set()
        replica.stop.set()
        await asyncio.wait_for(task, timeout=30)


async def events_stored(settings: Settings) -> int:
    async with jetstream(settings) as js:
        return (await js.stream_info(settings.event_stream)).state.messages


async def test_a_reschedule_after_a_batch_rolled_back_past_its_puback_does_not_fire_a_one_shot_twice(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's session ends after the PubAck (a dropped connection, a failover, the idle
    timeout on a slow publish): Postgres rolls the claim back, and the row looks as if the timer
    had never been claimed, though its event is out. A ScheduleTimer that arrives then, before the
    next claim, must not make the one-shot timer fire a second time at the new dueAt (README,
    States: a reschedule once the timer is claimed is ignored for a one-shot timer).

    The replica records the acknowledged firing again at once, in a transaction of its own
    (FiringLoop._record_again): the reschedule, sent once the session is gone and that record
    is in, meets a Reached timer. Claims stay shut until intake has taken it, so a timer left
    Scheduled by the rollback could only be claimed again after the reschedule."""
    async with first_batch_lost_after_its_puback(settings, db_url, monkeypatch) as (died, claims_open):
        insert_due(db_url, "once")
        await until(died.is_set, what="the event published and its batch's session ended")
        # Claims are shut: only the record in a transaction of its own can make it Reached.
        await until(
            lambda: row(db_url, "acme", "once")["state"] == "Reached",  # type: ignore[index]
            what="the acknowledged firing recorded again after the rollback",
        )
        reached = row(db_url, "acme", "once")
        before = commands_applied("schedule", *OUTCOMES)
        async with jetstream(settings) as js:
            body = {"tenantId": "acme", "serviceCallId": "once", "dueAt": iso_in(2, db_url)}
            await publish_raw(js, settings, "acme", "schedule", body)
        await until(
            lambda: commands_applied("schedule", *OUTCOMES) > before, what="intake to take the reschedule"
        )
        claims_open.set()
        assert row(db_url, "acme", "once") == reached  # Reached is final: the reschedule was ignored
    events = await events_stored(settings)
    assert events == 1, f"a one-shot timer fired {events} times (its old dueAt, then the new one)"


async def test_a_recurring_timer_whose_batch_rolled_back_past_its_puback_moves_on_once(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the same path, with claims shut, a recurring timer's next occurrence is stored
    once: the row holds occurrence 1, an hour after the first, fired once, unleased. (A second
    publish of occurrence 0 would be deduplicated, so the row, not the stream, is the proof.)"""
    async with first_batch_lost_after_its_puback(settings, db_url, monkeypatch) as (died, claims_open):
        query(
            db_url,
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
            " VALUES ('acme', 'tick', 'Scheduled', now() - interval '1 s', now() - interval '1 s', 'PT1H')",
        )
        await until(died.is_set, what="the event published and its batch's session ended")
        await until(
            lambda: row(db_url, "acme", "tick")["occurrence_index"] == 1,  # type: ignore[index]
            what="the acknowledged firing recorded again after the rollback",
        )
        claims_open.set()
    stored = row(db_url, "acme", "tick")
    assert stored is not None
    assert (stored["state"], stored["fired_count"], stored["attempts"], stored["lease_owner"]) == (
        "Scheduled",
        1,
        0,
        None,
    )
    assert stored["due_at"] == stored["anchor_due_at"] + timedelta(hours=1)
    assert await events_stored(settings) == 1


async def test_a_batch_whose_every_publish_beats_the_publish_timeout_is_recorded(
    settings: Settings, db_url: str
) -> None:
    """The publish timeout is held below the lease (Settings) so that a batch's session is idle in
    its transaction for less than the lease (adapters/postgres/db.py). But a batch publishes its first
    attempts and its retries in two calls, one after the other, each given the whole timeout: on
    a slow NATS (every PubAck within the timeout) the session outlives the lease, Postgres ends it,
    and the claim rolls back, attempts included, so the next claim has the same shape again."""
    lease_ms, publish_timeout_ms, one_way_s = 1000, 900, 0.3  # a PubAck in ~0.6 s: well within the timeout
    host, port = settings.nats_url.removeprefix("nats://").split(":")
    with Proxy(host, int(port)) as proxy:
        slow: dict[str, Any] = {
            "nats_url": proxy.url_for(settings.nats_url),
            "lease_ms": lease_ms,
            "publish_timeout_ms": publish_timeout_ms,
        }
        async with running_replica(settings, **slow):
            proxy.set_latency(one_way_s)
            # One statement, so one claim takes both: a first attempt, and a retry whose previous
            # claim's lease (a stop) ran out.
            query(
                db_url,
                "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, attempts,"
                " lease_owner, lease_token, lease_expires_at)"
                " VALUES ('acme', 'first', 'Scheduled', %s, %s, 0, NULL, NULL, NULL),"
                " ('acme', 'retry', 'Scheduled', %s, %s, 1, 'gone', 1, now() - interval '1 s')",
                *[iso_in(-1, db_url)] * 4,
            )
            await until(
                lambda: query(db_url, "SELECT count(*) FROM timers WHERE state = 'Reached'") == [(2,)],
                timeout=30,
                what="both timers recorded Reached (every publish acknowledged within the timeout)",
            )


async def test_a_timers_pause_deferred_behind_a_batch_in_flight_does_not_undo_its_later_resume(
    db_url: str,
) -> None:
    """A timer's pauses and resumes apply in stream order (docs/USING.md, Pause and resume). A Pause of a
    recurring timer whose occurrence a batch in flight holds is deferred (control_timers: `claimed`);
    the Resume after it, delivered once that batch is recorded, finds nothing paused. When the
    Pause comes back (its NAK delay), it must not pause the timer again: the last word was Resume."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " VALUES ('acme', 'tick', 'Scheduled', now() - interval '1 s', now() - interval '1 s', 'PT1H')",
    )
    async with db.pool(db_url, "review", min_size=1, max_size=2, idle_in_transaction_ms=60_000) as pool:
        store = Store(pool)
        batch = await store.claim(ClaimParams("firing", 10, 2, 10_000, 0, 2000, 60_000))
        (held,) = batch.result.claimed
        (stored_at,) = query(db_url, "SELECT now()")[0]
        pause, resume = PauseTimers("acme", "tick", resume=False), PauseTimers("acme", "tick", resume=True)
        assert (await store.pause(pause, Position(10, stored_at))).outcomes == ["deferred"]
        assert await batch.record([Fired(held, *next_of(held))], []) == 1
        await store.pause(resume, Position(11, stored_at))  # nothing to resume yet: ignored
        await store.pause(pause, Position(10, stored_at))  # the deferred Pause, redelivered
    assert query(db_url, "SELECT state, paused_at IS NOT NULL FROM timers") == [("Scheduled", False)]
