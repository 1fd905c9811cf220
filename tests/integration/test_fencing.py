"""The lease is a fence: a replica whose lease ran out changes nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from datetime import timedelta

import psycopg
import pytest

from tests.helpers import iso_in, jetstream, query, row, running_replica, until
from tests.twins import claim_params
from worker.adapters.store import Store
from worker.config import Settings
from worker.core.domain import Fired
from worker.core.firing import next_of
from worker.service import Replica


def insert_due(db_url: str, key: str) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
        " VALUES ('acme', %s, 'Scheduled', %s, %s)",
        key,
        iso_in(-1, db_url),
        iso_in(-1, db_url),
    )


def lease_expired(db_url: str) -> bool:
    return query(db_url, "SELECT bool_and(lease_expires_at < now()) FROM timers")[0][0] is True


async def test_expired_lease_cannot_mark_reached(store: Store, db_url: str, settings: Settings) -> None:
    insert_due(db_url, "paused")
    claim = await store.claim(claim_params("zombie", 10, 2, lease_ms=200))
    assert [c.service_call_id for c in claim.claimed] == ["paused"]
    await until(lambda: lease_expired(db_url), what="lease expiry on the database clock")
    # Nobody else claimed it, yet the zombie's mark is refused: its lease is over.
    assert await store.mark_fired([Fired(claim.claimed[0], None, None)]) == 0
    assert query(db_url, "SELECT state FROM timers") == [("Scheduled",)]


async def test_a_newer_claim_fences_off_the_older_one(store: Store, db_url: str) -> None:
    insert_due(db_url, "contested")
    old = await store.claim(claim_params("zombie", 10, 2, lease_ms=200))
    await until(lambda: lease_expired(db_url), what="lease expiry")
    new = await store.claim(claim_params("healthy", 10, 2, lease_ms=10_000))
    assert [c.service_call_id for c in new.claimed] == ["contested"]
    assert new.claimed[0].lease_token > old.claimed[0].lease_token
    assert new.claimed[0].attempts == 2
    assert await store.mark_fired([Fired(old.claimed[0], None, None)]) == 0
    assert await store.mark_fired([Fired(new.claimed[0], None, None)]) == 1
    assert query(db_url, "SELECT state, lease_owner FROM timers") == [("Reached", None)]


async def test_a_live_lease_is_not_claimed_twice(store: Store, db_url: str) -> None:
    for i in range(50):
        insert_due(db_url, f"k{i}")
    first = await store.claim(claim_params("a", 30, 5, lease_ms=10_000))
    second = await store.claim(claim_params("b", 100, 5, lease_ms=10_000))
    keys_a = {c.service_call_id for c in first.claimed}
    keys_b = {c.service_call_id for c in second.claimed}
    assert len(keys_a) == 30 and len(keys_b) == 20
    assert sorted(keys_a | keys_b) == sorted(f"k{i}" for i in range(50))


async def test_a_recurring_timer_refired_after_a_crash_skips_no_occurrence(store: Store, db_url: str) -> None:
    # Every second from now. A replica claims occurrence 0 at once and dies; by the time its
    # lease runs out and another replica fires it, occurrence 1 is due too. That is a crash, not
    # downtime: occurrence 1 must still fire next, not be skipped for occurrence 2.
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " VALUES ('acme', 'tick', 'Scheduled', now(), now(), 'PT1S')",
    )
    crashed = await store.claim(claim_params("crashed", 10, 2, lease_ms=200))
    (first,) = crashed.claimed
    await until(lambda: lease_expired(db_url), what="the crashed replica's lease to run out")
    await until(
        lambda: query(db_url, "SELECT now() > due_at + interval '1.2 s' FROM timers")[0][0],
        what="occurrence 1 to come due",
    )
    (again,) = (await store.claim(claim_params("healthy", 10, 2, lease_ms=10_000))).claimed
    assert again.attempts == 2
    assert again.recurrence_ref == first.recurrence_ref  # the claim that counts is the first one
    nxt = next_of(again)
    assert nxt == (first.due_at + timedelta(seconds=1), 1)
    assert await store.mark_fired([Fired(again, *nxt)]) == 1
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
    (late,) = (await store.claim(claim_params("healthy", 10, 2, lease_ms=3000, downtime_ms=5000))).claimed
    assert next_of(late) == (late.due_at + timedelta(seconds=1), 1)


async def test_an_occurrence_claimed_after_downtime_skips_the_missed_window(
    store: Store, db_url: str
) -> None:
    insert_tick(db_url, -3.5)
    (late,) = (await store.claim(claim_params("healthy", 10, 2, lease_ms=3000, downtime_ms=3000))).claimed
    (at,) = query(db_url, "SELECT now()")[0]
    nxt = next_of(late)
    assert (
        nxt[1] == 4 and nxt[0] is not None and at - timedelta(seconds=1) < nxt[0] <= at + timedelta(seconds=1)
    )


async def test_two_crashes_in_a_row_skip_no_occurrence(store: Store, db_url: str) -> None:
    # Each crash hides the timer for a lease (2 s), longer than the period. After the second,
    # occurrence 2 is overdue by more than the downtime allowance (1.5 s here), yet the fleet was
    # claiming all along: the reference carried from occurrence 0 keeps it, and 3 comes next.
    insert_tick(db_url, 0)
    (dying,) = (await store.claim(claim_params("crashed-1", 10, 2, lease_ms=2000))).claimed
    await until(lambda: lease_expired(db_url), what="the first crashed lease to run out")
    (zero,) = (await store.claim(claim_params("b", 10, 2, lease_ms=2000, downtime_ms=1500))).claimed
    assert await store.mark_fired([Fired(zero, *next_of(zero))]) == 1
    (one,) = (await store.claim(claim_params("crashed-2", 10, 2, lease_ms=2000, downtime_ms=1500))).claimed
    assert one.occurrence_index == 1 and one.recurrence_ref == dying.recurrence_ref
    await until(lambda: lease_expired(db_url), what="the second crashed lease to run out")
    (again,) = (await store.claim(claim_params("c", 10, 2, lease_ms=2000, downtime_ms=1500))).claimed
    assert await store.mark_fired([Fired(again, *next_of(again))]) == 1
    (two,) = (await store.claim(claim_params("c", 10, 2, lease_ms=2000, downtime_ms=1500))).claimed
    assert query(db_url, "SELECT now() - %s > interval '1.5 s'", two.due_at) == [(True,)]
    assert next_of(two) == (dying.due_at + timedelta(seconds=3), 3)


def waiting_on_a_lock(db_url: str) -> bool:
    return bool(
        query(
            db_url,
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )[0][0]
    )


async def test_a_hard_stop_ends_a_replica_whose_mark_waits_on_a_lock_and_loses_nothing(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM's hard stop bounds the exit whatever is in flight (issue 19, defect 5): a mark held
    by a row lock is cancelled at the drain timeout; the row stays claimed, unmarked, and another
    replica fires it once the lease has run out."""
    drain_s = 1.0
    replica = Replica(settings.model_copy(update={"drain_timeout_ms": round(drain_s * 1000)}))
    locker = await psycopg.AsyncConnection.connect(db_url)  # the test's own transaction
    mark_started = asyncio.Event()
    real_mark = replica.store.mark_fired

    async def mark_behind_a_row_lock(fired: Sequence[Fired]) -> int:
        # Published and acknowledged; before the real mark runs, the test locks the row.
        await locker.execute("SELECT 1 FROM timers WHERE service_call_id = 'held' FOR UPDATE")
        mark_started.set()
        return await real_mark(fired)

    monkeypatch.setattr(replica.store, "mark_fired", mark_behind_a_row_lock)
    task = asyncio.create_task(replica.run(handle_signals=False))
    try:
        await until(lambda: replica.started.is_set(), what="replica start")
        insert_due(db_url, "held")
        await until(
            lambda: mark_started.is_set() and waiting_on_a_lock(db_url), what="the mark waiting on the lock"
        )
        stopped = time.monotonic()
        replica.stop.set()  # what SIGTERM does
        done, _ = await asyncio.wait({task}, timeout=drain_s + 15)
        took = time.monotonic() - stopped
        assert task in done, f"still running {took:.1f}s after the stop (drain timeout {drain_s}s)"
        assert took < drain_s + 3, f"exited {took:.1f}s after the stop (drain timeout {drain_s}s)"
        assert task.result() == 0
    finally:
        await locker.rollback()
        await locker.close()
        await asyncio.wait_for(task, timeout=30)
    held = row(db_url, "acme", "held")
    assert held is not None
    assert (held["state"], held["lease_owner"], held["fired_count"]) == ("Scheduled", settings.worker_id, 0)
    async with running_replica(settings, worker_id="second"):
        await until(
            lambda: query(db_url, "SELECT state FROM timers") == [("Reached",)],
            what="the held occurrence fired by another replica after the lease",
        )
    async with jetstream(settings) as js:  # published twice, stored once (Nats-Msg-Id)
        assert (await js.stream_info(settings.event_stream)).state.messages == 1
