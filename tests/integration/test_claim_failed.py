"""A batch whose claim recorded one-shot occurrences that did not all fire (a failed one next to
fired ones, a stop) puts those back, leased, in its own transaction (Batch, sql/queries/firing.sql
retry_later): what a command, a pause and the read model meet, and a row that keeps failing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers import query, row, until
from tests.twins import claim_params
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.contract import CancelTimer, PauseTimers, Repeat, ScheduleTimer
from worker.core.domain import Claimed, Fired
from worker.core.ports import ClaimedBatch
from worker.core.recurrence import next_of


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    pool = db.pool(db_url, "failed", min_size=1, max_size=4, idle_in_transaction_ms=60_000)
    async with pool:
        yield Store(pool)


def timer(key: str, seconds: float, tenant: str = "acme") -> ScheduleTimer:
    due = (datetime.now(UTC) + timedelta(seconds=seconds)).replace(microsecond=0)
    return ScheduleTimer(tenant, key, due, None, 1, None)


def stored(db_url: str, key: str, tenant: str = "acme") -> dict[str, Any]:
    found = row(db_url, tenant, key)
    assert found is not None
    return found


def by_key(batch: ClaimedBatch) -> dict[str, Claimed]:
    return {c.service_call_id: c for c in batch.result.claimed}


async def claim_until(
    store: Store, db_url: str, key: str, tenant: str = "acme"
) -> tuple[ClaimedBatch, Claimed]:
    """Once `key`'s lease (its back-off, a stop's) ran out on the database clock, claim it."""
    expired = "SELECT lease_expires_at < now() FROM timers WHERE tenant_id = %s AND service_call_id = %s"
    await until(lambda: query(db_url, expired, tenant, key)[0][0], what=f"{key}'s lease ran out")
    batch = await store.claim(claim_params("b", 10, lease_ms=10_000))
    return batch, by_key(batch)[key]


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
        batch, again = await claim_until(store, db_url, "bad")
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
    again, stop = await claim_until(store, db_url, "stop")  # the lease ran out
    assert stop.attempts == 2
    assert await again.record([Fired(c, None, None) for c in again.result.claimed], []) == 2
    assert (await store.apply([timer("stop", 60)])).outcomes == ["ignored"]
    assert (stored(db_url, "stop")["state"], stored(db_url, "stop")["fired_count"]) == ("Reached", 1)


async def test_a_tenants_pause_with_a_failing_batch_in_flight_waits_for_the_failed_one(
    store: Store, db_url: str
) -> None:
    hourly = ScheduleTimer("calm", "every", timer("every", -1).due_at, None, 1, Repeat("PT1H", None, None))
    await store.apply(
        [timer("ok", -3, "calm"), timer("bad", -2, "calm"), timer("later", 600, "calm"), hourly]
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
    again, bad = await claim_until(store, db_url, "bad", "calm")
    assert await again.record([Fired(bad, None, None)], []) == 1
    assert (await store.pause(pause)).outcomes == ["applied"]
    assert [stored(db_url, k, "calm")["state"] for k in ("ok", "bad", "later", "every")] == [
        "Reached",
        "Reached",
        "Paused",
        "Paused",
    ]
