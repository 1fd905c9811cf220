"""The fence: a replica whose batch outlived its lease changes nothing. A batch is one transaction
from the claim to the mark (its row locks keep everyone else off); a replica frozen mid-batch has
its session ended by idle_in_transaction_session_timeout (the lease) and its claim rolled back; a
batch that ends unrecorded (a stop) commits its lease, which holds the rows until it runs out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta

import pytest

from tests.helpers import (
    commands_applied,
    insert_due,
    jetstream,
    publish_raw,
    query,
    row,
    running_replica,
    until,
)
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.contract import Outgoing, PauseTimers
from worker.core.domain import ClaimParams, Fired
from worker.core.ports import ClaimedBatch
from worker.core.recurrence import next_of
from worker.errors import TransientError
from worker.service import Replica


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
async def store(db_url: str) -> AsyncIterator[Store]:
    """The replica's Store through the replica's pool (adapters/postgres/db.py), on a short lease."""
    pool = db.pool(db_url, "fencing", min_size=1, max_size=4, idle_in_transaction_ms=LEASE_MS)
    await pool.open()
    yield Store(pool)
    await pool.close()


def claim(owner: str, limit: int = 10, lease_ms: int = LEASE_MS, downtime_ms: int = 60_000) -> ClaimParams:
    return ClaimParams(owner, limit, 2, lease_ms, 0, 2000, downtime_ms)


async def test_a_batch_frozen_past_its_lease_records_nothing(store: Store, db_url: str) -> None:
    """A replica paused mid-batch: Postgres ends its claim's session once idle for the lease
    (idle_in_transaction_session_timeout) and rolls the claim back; the replica, waking, can
    commit nothing, and the timer is as before the claim."""
    insert_due(db_url, "paused")
    batch = await store.claim(claim("zombie"))
    (paused,) = batch.result.claimed
    await until(lambda: not in_transaction(db_url), what="the frozen batch's session to be ended")
    with pytest.raises(TransientError):
        await batch.record([Fired(paused, None, None)], [])
    await batch.close()
    assert query(db_url, "SELECT state, lease_owner, attempts FROM timers") == [("Scheduled", None, 0)]


async def test_a_newer_claim_takes_a_frozen_batch_and_the_frozen_one_changes_nothing(
    store: Store, db_url: str
) -> None:
    insert_due(db_url, "contested")
    old = await store.claim(claim("zombie"))
    taken: list[ClaimedBatch] = []

    async def reclaimed() -> bool:
        batch = await store.claim(claim("healthy", lease_ms=10_000))
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


async def test_a_batch_in_flight_or_stopped_is_not_claimed_twice(store: Store, db_url: str) -> None:
    for i in range(50):
        insert_due(db_url, f"k{i}")
    first = await store.claim(claim("a", 30, lease_ms=10_000))  # in flight: its rows locked
    second = await store.claim(claim("b", 100, lease_ms=10_000))
    await second.close()  # stopped: its lease committed
    third = await store.claim(claim("c", 100, lease_ms=10_000))
    keys_a = {c.service_call_id for c in first.result.claimed}
    keys_b = {c.service_call_id for c in second.result.claimed}
    assert len(keys_a) == 30 and len(keys_b) == 20 and third.result.claimed == []
    assert sorted(keys_a | keys_b) == sorted(f"k{i}" for i in range(50))
    await first.close()


async def test_a_stopped_batch_keeps_its_claim_until_the_lease_runs_out(store: Store, db_url: str) -> None:
    insert_due(db_url, "stopped")
    batch = await store.claim(claim("stopping"))
    await batch.close()  # a stop: published or not, unrecorded
    assert query(db_url, "SELECT lease_owner, attempts FROM timers") == [("stopping", 1)]
    assert (await store.claim(claim("other"))).result.claimed == []
    await until(lambda: lease_expired(db_url), what="the stopped batch's lease to run out")
    again = await store.claim(claim("other"))
    assert [(c.service_call_id, c.attempts) for c in again.result.claimed] == [("stopped", 2)]
    await again.close()


async def test_a_recurring_timer_refired_after_a_crash_skips_no_occurrence(store: Store, db_url: str) -> None:
    # Every second from now. A replica claims occurrence 0 at once and dies; by the time its
    # claim is rolled back and another replica fires it, occurrence 1 is due too. That is a
    # crash, not downtime: occurrence 1 must still fire next, not be skipped for occurrence 2.
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " VALUES ('acme', 'tick', 'Scheduled', now(), now(), 'PT1S')",
    )
    crashed = await store.claim(claim("crashed"))
    (first,) = crashed.result.claimed
    await until(lambda: not in_transaction(db_url), what="the crashed replica's claim to be rolled back")
    await until(
        lambda: query(db_url, "SELECT now() > due_at + interval '1.2 s' FROM timers")[0][0],
        what="occurrence 1 to come due",
    )
    healthy = await store.claim(claim("healthy", lease_ms=10_000))
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
    store: Store, db_url: str
) -> None:
    # The replica that marked the occurrence before this one died right after: the next claim
    # comes from another replica's poll, a poll interval (2 s) later. Not downtime, so the
    # occurrence due meanwhile is next, not skipped.
    insert_tick(db_url, -1.5)
    (late,) = (await store.claim(claim("healthy", lease_ms=3000, downtime_ms=5000))).result.claimed
    assert next_of(late) == (late.due_at + timedelta(seconds=1), 1)


async def test_an_occurrence_claimed_after_downtime_skips_the_missed_window(
    store: Store, db_url: str
) -> None:
    insert_tick(db_url, -3.5)
    (late,) = (await store.claim(claim("healthy", lease_ms=3000, downtime_ms=3000))).result.claimed
    (at,) = query(db_url, "SELECT now()")[0]
    nxt = next_of(late)
    assert (
        nxt[1] == 4 and nxt[0] is not None and at - timedelta(seconds=1) < nxt[0] <= at + timedelta(seconds=1)
    )


async def test_two_stops_in_a_row_skip_no_occurrence(store: Store, db_url: str) -> None:
    # Each stopped batch keeps the timer claimed for a lease (2 s), longer than the period. After
    # the second, occurrence 2 is overdue by more than the downtime allowance (1.5 s here), yet the
    # fleet was claiming all along: the reference carried from occurrence 0 keeps it, and 3 comes next.
    insert_tick(db_url, 0)
    stopped = await store.claim(claim("stopped-1", lease_ms=2000))
    await stopped.close()
    (dying,) = stopped.result.claimed
    await until(lambda: lease_expired(db_url), what="the first stopped lease to run out")
    b = await store.claim(claim("b", lease_ms=2000, downtime_ms=1500))
    (zero,) = b.result.claimed
    assert await b.record([Fired(zero, *next_of(zero))], []) == 1
    stopped = await store.claim(claim("stopped-2", lease_ms=2000, downtime_ms=1500))
    await stopped.close()
    (one,) = stopped.result.claimed
    assert one.occurrence_index == 1 and one.recurrence_ref == dying.recurrence_ref
    await until(lambda: lease_expired(db_url), what="the second stopped lease to run out")
    c = await store.claim(claim("c", lease_ms=2000, downtime_ms=1500))
    (again,) = c.result.claimed
    assert await c.record([Fired(again, *next_of(again))], []) == 1
    c = await store.claim(claim("c", lease_ms=2000, downtime_ms=1500))
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


def waiting_on_a_lock(db_url: str) -> bool:
    return query(
        db_url,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    ) != [(0,)]


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
    past the PubAck, pause a timer whose event is out. It is deferred, and after the mark it finds
    the timer Reached."""
    insert_due(db_url, "held")
    # Not the 1 s idle timeout of this module's store: only the test ends this batch.
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
