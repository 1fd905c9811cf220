"""One set of checks, run against each in-memory twin (tests/twins.py) and its real adapter: what the
loops' unit tests assume of a twin is what Postgres and JetStream do."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Protocol

import pytest

from tests.helpers import query, until
from tests.twins import TwinBatch, TwinPublisher, TwinStore, claim_params
from worker.adapters.jetstream.broker import Broker
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.contract import CancelTimer, Outgoing, PauseTimers, Repeat, ScheduleTimer
from worker.core.domain import BulkAction, Claimed, ClaimParams, ClaimResult, Fired, Position, Unreadable
from worker.core.ports import ClaimedBatch, EventPublisher, FiringStore, IntakeStore
from worker.errors import TransientError


class Ports(FiringStore, IntakeStore, Protocol):
    """Both halves of the store's ports."""


# The adapter's claims run in the pool the replica uses (adapters/postgres/db.py: its session pins, and
# idle_in_transaction_session_timeout as the lease of a batch in flight): a minute, longer than any
# check here holds a batch open on a loaded machine, or this short where a frozen batch is the point.
IDLE_MS = 60_000
FROZEN_IDLE_MS = 1000


@contextlib.asynccontextmanager
async def both_ports(param: str, db_url: str, idle_ms: int) -> AsyncIterator[Ports]:
    if param == "twin":
        yield TwinStore(time.time)  # on the wall clock, as the database is
        return
    pool = db.pool(db_url, "conformance", min_size=1, max_size=4, idle_in_transaction_ms=idle_ms)
    async with pool:
        yield Store(pool)


@pytest.fixture(params=["twin", "postgres"])
async def ports(request: pytest.FixtureRequest, db_url: str) -> AsyncIterator[Ports]:
    async with both_ports(request.param, db_url, IDLE_MS) as ports:
        yield ports


@pytest.fixture(params=["twin", "postgres"])
async def frozen_ports(request: pytest.FixtureRequest, db_url: str) -> AsyncIterator[Ports]:
    """As `ports`, with a batch's session ended after FROZEN_IDLE_MS idle in its transaction."""
    async with both_ports(request.param, db_url, FROZEN_IDLE_MS) as ports:
        yield ports


@pytest.fixture(params=["twin", "jetstream"])
async def publisher(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[EventPublisher]:
    if request.param == "twin":
        yield TwinPublisher(time.time, settings.subject_prefix)
        return
    broker = Broker(settings)
    await broker.connect()
    await broker.ensure_streams()
    yield broker
    await broker.close()


def at(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def schedule(key: str, seconds: float, ts: int = 1) -> ScheduleTimer:
    return ScheduleTimer("acme", key, at(seconds).replace(microsecond=0), None, ts, None)


async def claim_one(store: Ports, owner: str, lease_ms: int = 10_000) -> list[Claimed]:
    """A claim whose batch ends unrecorded (as at a stop): what it took stays claimed for the lease."""
    batch = await store.claim(claim_params(owner, 10, 0, lease_ms=lease_ms, ahead_ms=100))
    await batch.close()
    return batch.result.claimed


async def claim_closed(store: Ports, params: ClaimParams) -> ClaimResult:
    """One claim, its batch ended unrecorded at once (a stop): its result."""
    batch = await store.claim(params)
    await batch.close()
    return batch.result


async def test_a_claim_takes_what_is_due_once_and_says_when_the_next_comes(ports: Ports) -> None:
    assert (await ports.apply([schedule("due", -1), schedule("later", 60)])).outcomes == [
        "applied",
        "applied",
    ]
    sent = time.monotonic()
    result = await claim_closed(ports, claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    if isinstance(ports, Store):  # when its clock reading arrived, for the estimate (the twin's: now)
        assert result.received is not None and sent <= result.received <= time.monotonic()
    assert [(c.service_call_id, c.attempts) for c in result.claimed] == [("due", 1)]
    assert not result.unreadable
    assert result.next_due_in_ms is not None and 58_000 < result.next_due_in_ms < 60_000
    assert abs(result.db_now.timestamp() - time.time()) < 5
    again = await claim_closed(ports, claim_params("b", 10, 0, lease_ms=10_000, ahead_ms=100))
    assert again.claimed == [] and again.next_due_in_ms is not None
    far = await claim_closed(ports, claim_params("c", 10, 0, lease_ms=10_000, ahead_ms=100_000))
    assert far.next_due_in_ms is None


async def spoil(ports: Ports, key: str) -> None:
    """Give the timer a dueAt no datetime holds ('-infinity': due, and sorted first)."""
    if isinstance(ports, TwinStore):
        ports.spoil(("acme", key))
        return
    assert isinstance(ports, Store)
    async with ports.pool.connection() as conn:
        await conn.execute(
            "UPDATE timers SET due_at = '-infinity' WHERE tenant_id = 'acme' AND service_call_id = %s", [key]
        )


async def test_a_row_whose_due_at_no_datetime_holds_is_claimed_as_unreadable(ports: Ports) -> None:
    await ports.apply([schedule("bad", -1), schedule("good", -1)])
    await spoil(ports, "bad")
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000))
    result = batch.result
    assert [c.service_call_id for c in result.claimed] == ["good"]
    (bad,) = result.unreadable
    assert bad._replace(row_id="") == Unreadable("acme", "bad", result.claimed[0].lease_token, 1, "")
    # Released like any claimed occurrence, in the claim's transaction, and claimable again after
    # its back-off.
    assert await batch.record([], [(bad, "unreadable", 200)]) == 0
    again: list[Unreadable] = []

    async def reclaimed() -> bool:
        again.extend((await claim_closed(ports, claim_params("b", 10, 0, lease_ms=10_000))).unreadable)
        return bool(again)

    await until(reclaimed, what="the back-off to pass")
    assert again[0].attempts == 2 and again[0].lease_token != bad.lease_token


async def test_the_recurrence_reference_moves_to_now_only_after_downtime(ports: Ports) -> None:
    """claim_due's claimed_at: a timer left unclaimed for less than downtime_ms keeps its dueAt
    as the reference (what came due meanwhile still fires); for longer, the reference is now."""
    await ports.apply([schedule("crash", -5)])
    (kept,) = (await claim_closed(ports, claim_params("a", 10, 0, lease_ms=300, downtime_ms=60_000))).claimed
    assert kept.recurrence_ref == kept.due_at
    # Its lease runs out: re-claimed within downtime_ms of that, the reference is kept.
    again: list[Claimed] = []

    async def reclaimed(downtime_ms: int) -> bool:
        params = claim_params("b", 10, 0, lease_ms=300, downtime_ms=downtime_ms)
        again[:] = (await claim_closed(ports, params)).claimed
        return bool(again)

    await until(lambda: reclaimed(60_000), what="the lease to run out")
    assert again[0].recurrence_ref == kept.due_at and again[0].attempts == 2
    # Re-claimed when its lease ran out longer than downtime_ms ago: downtime, the reference is now.
    # downtime_ms 0, not 1: a claim is only possible once the lease has run out, so with 0 every
    # re-claim is past it; with 1, one polled within a millisecond of the expiry kept the reference.
    await until(lambda: reclaimed(0), what="the lease to run out")
    assert again[0].recurrence_ref > kept.due_at + timedelta(seconds=4)
    assert abs(again[0].recurrence_ref.timestamp() - time.time()) < 5

    await ports.apply([schedule("down", -5)])
    result = await claim_closed(ports, claim_params("c", 10, 0, lease_ms=10_000, downtime_ms=1000))
    (moved,) = [c for c in result.claimed if c.service_call_id == "down"]
    assert moved.recurrence_ref > moved.due_at + timedelta(seconds=4)


async def test_a_batch_left_open_past_its_lease_is_rolled_back_and_records_nothing(
    frozen_ports: Ports,
) -> None:
    """A replica frozen mid-batch: its claim ends when its session has been idle for the lease (the
    pool's idle_in_transaction_session_timeout), the rows are claimable at once, and it cannot
    record anything when it wakes up."""
    await frozen_ports.apply([schedule("k", -1)])
    zombie = await frozen_ports.claim(claim_params("zombie", 10, lease_ms=FROZEN_IDLE_MS, ahead_ms=100))
    (old,) = zombie.result.claimed
    taken: list[ClaimedBatch] = []

    async def reclaimed() -> bool:
        batch = await frozen_ports.claim(claim_params("healthy", 10, lease_ms=10_000, ahead_ms=100))
        if batch.result.claimed:
            taken.append(batch)
        return bool(taken)

    await until(reclaimed, what="the frozen batch to be rolled back and the timer claimed again")
    (new,) = taken[0].result.claimed
    assert new.attempts == 1 and new.lease_token != old.lease_token  # the frozen claim left no trace
    with pytest.raises(TransientError):
        await zombie.record([Fired(old, None, None)], [])
    await zombie.close()
    assert await taken[0].record([Fired(new, None, None)], []) == 1
    assert await claim_one(frozen_ports, "late") == []


async def test_a_released_occurrence_is_claimable_after_its_back_off(ports: Ports) -> None:
    await ports.apply([schedule("k", -1)])
    batch = await ports.claim(claim_params("a", 10, lease_ms=10_000, ahead_ms=100))
    (first,) = batch.result.claimed
    assert await batch.record([], [(first, "publish: TimeoutError", 200)]) == 0
    assert await claim_one(ports, "b") == []  # not before its back-off
    again: list[Claimed] = []

    async def reclaimed() -> bool:
        again.extend(await claim_one(ports, "b"))
        return bool(again)

    await until(reclaimed, what="the back-off to pass")
    assert again[0].attempts == 2


async def test_commands_for_a_claimed_occurrence_wait_and_a_reached_timer_ignores_them(ports: Ports) -> None:
    await ports.apply([schedule("held", -1)])
    await claim_one(ports, "stopped")  # claimed, its batch ended unrecorded: the lease holds it
    assert (await ports.apply([CancelTimer("acme", "held", None, 2)])).outcomes == ["deferred"]
    await ports.apply([schedule("k", -1)])
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    (claimed,) = batch.result.claimed
    assert await batch.record([Fired(claimed, None, None)], []) == 1
    assert (await ports.apply([schedule("k", 60, ts=3)])).outcomes == ["ignored"]  # Reached is final
    assert (await ports.apply([CancelTimer("other", "x", None, 2), schedule("y", 60, ts=1)])).outcomes == [
        "applied",
        "applied",
    ]


async def test_a_command_for_a_timer_in_a_batch_in_flight_is_deferred_without_waiting_for_it(
    ports: Ports,
) -> None:
    """Intake never waits on a row a claim's batch holds locked (sql/queries/intake.sql, lock_keys): were
    the batch rolled back after its publish, the command would meet the timer as if it had not
    fired. It is deferred, as for a claimed occurrence, and meets the recorded timer after."""
    await ports.apply([schedule("k", -1), schedule("free", 60)])
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    (claimed,) = batch.result.claimed
    t0 = datetime.now(UTC)
    commands = [
        CancelTimer("acme", "k", None, 2),
        schedule("k", 60, ts=3),
        CancelTimer("acme", "free", None, 2),
    ]
    positions = [Position(10, t0), Position(11, t0), Position(12, t0)]
    # A deadline well under the batch's lease: a wait on its lock would end only with the batch.
    applied = await asyncio.wait_for(ports.apply(commands, positions), 20)
    assert applied.outcomes == ["deferred", "deferred", "applied"]  # every command of the key waits
    assert await batch.record([Fired(claimed, None, None)], []) == 1
    again = await ports.apply(commands[:2], positions[:2])
    assert again.outcomes == ["ignored", "ignored"]  # Reached is final: the cancel came too late


def plain(key: str, seconds: float) -> ScheduleTimer:
    """A ScheduleTimer without timestampMs: only its place in the stream orders it."""
    return ScheduleTimer("acme", key, at(seconds).replace(microsecond=0), None, None, None)


async def test_a_command_earlier_in_the_stream_than_the_last_applied_is_ignored(ports: Ports) -> None:
    t0 = datetime.now(UTC)
    first, second = Position(10, t0), Position(11, t0 + timedelta(microseconds=1))
    # Two replicas took the key's commands side by side; the later one committed first.
    assert (await ports.apply([CancelTimer("acme", "k", None, None)], [second])).outcomes == ["applied"]
    assert (await ports.apply([plain("k", 60)], [first])).outcomes == ["ignored"]
    # A redelivery keeps its position: not older than itself (a cancel rewrites, a no-op).
    assert (await ports.apply([CancelTimer("acme", "k", None, None)], [second])).outcomes == ["applied"]
    # A recreated stream starts at 1 again, at a later stored time: never older.
    reborn = Position(1, t0 + timedelta(seconds=1))
    assert (await ports.apply([plain("k", 60)], [reborn])).outcomes == ["applied"]
    # A restatement from a later position records it, so an earlier command is still ignored.
    same = plain("k", 60)
    assert (await ports.apply([same], [Position(3, reborn.stored_at)])).outcomes == ["applied"]
    assert (await ports.apply([same], [Position(3, reborn.stored_at)])).outcomes == ["ignored"]
    cancel = CancelTimer("acme", "k", None, None)
    assert (await ports.apply([cancel], [Position(2, reborn.stored_at)])).outcomes == ["ignored"]


async def test_timestamps_order_commands_that_both_carry_one_whatever_their_stream_order(
    ports: Ports,
) -> None:
    t0 = datetime.now(UTC)
    assert (await ports.apply([schedule("k", 60, ts=20)], [Position(5, t0)])).outcomes == ["applied"]
    # Earlier in the stream, newer by timestampMs: the timestamp decides.
    later = CancelTimer("acme", "k", None, 30)
    assert (await ports.apply([later], [Position(4, t0)])).outcomes == ["applied"]
    # Without one, the stream decides: earlier than the last applied (4), ignored; later, applied.
    assert (await ports.apply([plain("k", 60)], [Position(3, t0)])).outcomes == ["ignored"]
    assert (await ports.apply([plain("k", 60)], [Position(6, t0)])).outcomes == ["applied"]


async def test_the_soonest_due_among_the_rows_a_batch_left_claimable_is_reported(ports: Ports) -> None:
    soon = schedule("soon", -1, ts=5)
    assert (await ports.apply([soon, schedule("later", 60)])).soonest_due == soon.due_at
    # An ignored command locked the row all the same: a claim meanwhile skipped it.
    stale = await ports.apply([schedule("soon", 30, ts=1)])
    assert stale.outcomes == ["ignored"] and stale.soonest_due == soon.due_at
    # Cancelled or claimed rows are no one's to wake for.
    assert (await ports.apply([CancelTimer("acme", "later", None, 2)])).soonest_due is None
    await claim_one(ports, "a")
    assert (await ports.apply([CancelTimer("acme", "soon", None, 9)])).soonest_due is None


async def test_a_newer_restatement_is_recorded_so_an_older_change_after_it_is_ignored(ports: Ports) -> None:
    """The same schedule again with a newer timestampMs changes nothing the timer does, but its
    timestamp is kept: a change stamped between the two arrives late and must lose to it."""
    first = schedule("k", 60, ts=2)
    assert (await ports.apply([first])).outcomes == ["applied"]
    assert (await ports.apply([first])).outcomes == ["ignored"]  # the same command again: nothing to do
    assert (await ports.apply([dataclasses.replace(first, timestamp_ms=5)])).outcomes == ["applied"]
    assert (await ports.apply([dataclasses.replace(first, due_at=at(120), timestamp_ms=3)])).outcomes == [
        "ignored"
    ]
    assert (await ports.apply([CancelTimer("acme", "k", None, 4)])).outcomes == ["ignored"]


async def test_the_quota_view_counts_pending_timers_up_to_the_cap(ports: Ports) -> None:
    await ports.apply(
        [schedule("a", 60), schedule("b", 60), schedule("c", 60), CancelTimer("acme", "d", None, 1)]
    )
    known, pending = await ports.quota_view(
        [("acme", "a"), ("acme", "d"), ("acme", "z")], ["acme", "none"], 2
    )
    assert known == {("acme", "a")} and pending == {"acme": 2, "none": 0}


async def test_each_message_id_is_stored_once_and_every_publish_has_an_answer(
    publisher: EventPublisher,
) -> None:
    subjects = publisher.subjects
    events = [Outgoing(subjects.due("acme"), b"{}", {"Nats-Msg-Id": f"acme:k{i}:1"}) for i in range(3)]
    assert await publisher.publish_atomic(events, 5.0) == [None, None, None]
    assert await publisher.publish_many(events, 5.0) == [None, None, None]  # duplicates: acknowledged
    assert await stored(publisher) == 3
    nowhere = Outgoing("no-stream-takes-this", b"{}", {"Nats-Msg-Id": "x"})
    (error,) = await publisher.publish_many([nowhere], 5.0)
    assert error is not None
    assert publisher.max_payload >= 1024 * 1024


async def stored(publisher: EventPublisher) -> int:
    if isinstance(publisher, TwinPublisher):
        return len(publisher.stored)
    assert isinstance(publisher, Broker)
    return int((await publisher.js.stream_info(publisher.settings.event_stream)).state.messages)


# Pause and resume (Store.pause, worker/adapters/postgres/pausing.py; docs/USING.md, Pause and resume).


def pause(tenant: str = "acme", key: str | None = None, resume: bool = False) -> PauseTimers:
    return PauseTimers(tenant, key, resume)


T0 = datetime.now(UTC)
# A tenant's pause and resume in the stream, as intake passes them; the same position again is a
# redelivery of the same command.
PAUSED, RESUMED = Position(1, T0), Position(2, T0)


async def state_of(ports: Ports, key: str, tenant: str = "acme") -> str:
    """The stored state (Paused is one of them, shown as Scheduled with paused by the read model)."""
    if isinstance(ports, TwinStore):
        return ports.rows[tenant, key].state
    assert isinstance(ports, Store)
    async with ports.pool.connection() as conn:
        cur = await conn.execute(
            "SELECT state FROM timers WHERE tenant_id = %s AND service_call_id = %s", [tenant, key]
        )
        found = await cur.fetchone()
    assert found is not None
    return str(found[0])


async def test_a_paused_tenants_timers_are_not_claimed_and_resumed_ones_are_oldest_first(
    ports: Ports,
) -> None:
    # Every dueAt from one moment: made as the test goes, a slow step would reorder them.
    base = at(0).replace(microsecond=0)

    def due(key: str, seconds: int, ts: int = 1) -> ScheduleTimer:
        return ScheduleTimer("acme", key, base + timedelta(seconds=seconds), None, ts, None)

    await ports.apply([due("a", -3), due("b", -2), due("c", -1)])
    await ports.apply([ScheduleTimer("other", "x", at(-1).replace(microsecond=0), None, 1, None)])
    # The first application sets the tenant's flag and pauses every row (a ScheduleTimer in flight
    # is waited for: lock_tenant); applied again (its redelivery), it finds nothing left to pause.
    assert (await ports.pause(pause(), PAUSED)).outcomes == ["applied"]
    assert (await ports.pause(pause(), PAUSED)).outcomes == ["applied"]
    assert [await state_of(ports, k) for k in "abc"] == ["Paused"] * 3
    assert [c.service_call_id for c in await claim_one(ports, "a")] == ["x"]  # another tenant's
    # A ScheduleTimer for the paused tenant is stored paused: a new timer, and a rescheduled one.
    moved = due("c", -5, ts=2)
    assert (await ports.apply([due("new", -4), moved])).outcomes == ["applied"] * 2
    assert await state_of(ports, "new") == "Paused" and await state_of(ports, "c") == "Paused"
    assert await claim_one(ports, "b") == []

    resumed = await ports.pause(pause(resume=True), RESUMED)
    assert resumed.outcomes == ["applied"] and resumed.soonest_due == moved.due_at
    assert (await ports.pause(pause(resume=True), RESUMED)).outcomes == ["applied"]
    # The pause redelivered after the resume is older: it changes nothing.
    assert (await ports.pause(pause(), PAUSED)).outcomes == ["applied"]
    assert await state_of(ports, "a") == "Scheduled"
    # Claimable again, oldest first: the claim's limit takes the two most overdue.
    params = claim_params("c", 2, 0, lease_ms=10_000, ahead_ms=100)
    assert sorted(c.service_call_id for c in (await claim_closed(ports, params)).claimed) == ["c", "new"]
    assert sorted(c.service_call_id for c in (await claim_closed(ports, params)).claimed) == ["a", "b"]


async def test_a_timer_paused_by_itself_stays_paused_through_its_tenants_resume(ports: Ports) -> None:
    own_timer = schedule("own", 60)
    await ports.apply([own_timer, schedule("with", 60), schedule("held", -1)])
    assert [c.service_call_id for c in await claim_one(ports, "a")] == ["held"]
    # Its claimed occurrence fires first; the pause is recorded, for its record (record_fired).
    assert (await ports.pause(pause(key="held"))).outcomes == ["applied"]
    assert (await ports.pause(pause(key="own"))).outcomes == ["applied"]
    assert (await ports.pause(pause(key="nobody"))).outcomes == ["ignored"]
    assert (await ports.pause(pause(key="with", resume=True))).outcomes == ["ignored"]  # not paused
    assert (await ports.pause(pause(), PAUSED)).outcomes == ["deferred"]
    # The claimed occurrence is still Scheduled: the tenant's pause is offered again until it is not.
    assert (await ports.pause(pause(), PAUSED)).outcomes == ["deferred"]
    assert [await state_of(ports, k) for k in ("own", "with", "held")] == ["Paused", "Paused", "Scheduled"]
    await ports.pause(pause(resume=True), RESUMED)
    assert await state_of(ports, "own") == "Paused" and await state_of(ports, "with") == "Scheduled"
    own = await ports.pause(pause(key="own", resume=True))
    assert own.outcomes == ["applied"] and own.soonest_due == own_timer.due_at
    assert await state_of(ports, "own") == "Scheduled"


async def test_a_paused_recurring_timer_resumed_after_downtime_has_its_reference_moved_to_now(
    ports: Ports,
) -> None:
    """Without the pause, a missed occurrence recorded overdue keeps its reference (a crash skips
    nothing); a pause clears it, so the resumed timer fires once for the missed window."""
    every = ScheduleTimer("acme", "rec", at(-10).replace(microsecond=0), None, 1, Repeat("PT1S", None, None))
    await ports.apply([every])
    params = claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100, downtime_ms=60_000)
    batch = await ports.claim(params)
    (first,) = batch.result.claimed
    assert first.recurrence_ref == first.due_at
    overdue = first.due_at + timedelta(seconds=1)
    assert await batch.record([Fired(first, overdue, 1)], []) == 1
    down = claim_params("b", 10, 0, lease_ms=10_000, ahead_ms=100, downtime_ms=1000)
    assert (await ports.pause(pause(key="rec"))).outcomes == ["applied"]
    assert await claim_one(ports, "c") == []
    assert (await ports.pause(pause(key="rec", resume=True))).outcomes == ["applied"]
    (again,) = (await claim_closed(ports, down)).claimed
    assert again.due_at == overdue and again.occurrence_index == 1
    assert again.recurrence_ref > overdue + timedelta(seconds=5)
    assert abs(again.recurrence_ref.timestamp() - time.time()) < 5


async def test_the_mark_of_an_occurrence_claimed_as_its_timer_or_tenant_was_paused_stores_it_paused(
    ports: Ports,
) -> None:
    """A claimed occurrence fires; the timer is paused right after it, in the record itself, so a
    recurring timer does not fire again before the pause is offered again (issue 23 review)."""
    every = Repeat("PT1S", None, None)
    start = at(-1).replace(microsecond=0)
    keys = ("mine", "tenant", "once")
    mine, tenant, once = (ScheduleTimer("acme", k, start, None, 1, every) for k in keys)
    await ports.apply([mine, tenant, dataclasses.replace(once, repeat=None)])
    params = claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100)
    batch = await ports.claim(params)
    claimed = {c.service_call_id: c for c in batch.result.claimed}
    assert sorted(claimed) == ["mine", "once", "tenant"]
    # A claim's batch in flight holds them: the tenant's flag is set, its rows wait for the record.
    assert (await ports.pause(pause(), PAUSED)).outcomes == ["deferred"]
    next_due = start + timedelta(seconds=60)
    fired = [
        Fired(claimed["mine"], next_due, 1),
        Fired(claimed["tenant"], next_due, 1),
        Fired(claimed["once"], None, None),
    ]
    assert await batch.record(fired, []) == 3
    assert [await state_of(ports, k) for k in keys] == ["Paused", "Paused", "Reached"]
    assert (await ports.pause(pause(), PAUSED)).outcomes == ["applied"]
    assert (await ports.pause(pause(resume=True), RESUMED)).outcomes == ["applied"]
    # A released claim (a publish backing off, its lease committed): the timer's own pause is
    # recorded at once, and the record of its retried occurrence stores the next one Paused.
    await ports.apply([dataclasses.replace(mine, service_call_id="rel")])
    batch = await ports.claim(params)
    (rel,) = batch.result.claimed
    await batch.record([], [(rel, "publish failed", 0)])
    assert (await ports.pause(pause(key="rel"))).outcomes == ["applied"]
    assert await state_of(ports, "rel") == "Scheduled"  # its occurrence still fires
    batch = await ports.claim(params)
    (again,) = batch.result.claimed
    assert await batch.record([Fired(again, next_due, 1)], []) == 1
    assert await state_of(ports, "rel") == "Paused"


def at_seq(seq: int) -> Position:
    """A timer's pause or resume at this place in the command stream (one stream: one stored time)."""
    return Position(seq, T0)


async def test_a_timers_pauses_and_resumes_apply_in_stream_order_whatever_order_they_arrive_in(
    ports: Ports,
) -> None:
    """docs/USING.md, Pause and resume: one older than the timer's last pause or resume changes nothing,
    even a resume that found nothing to resume; their order is their own (a ScheduleTimer older than
    them still applies) and outlives the timer's cancel and a ScheduleTimer bringing it back."""
    every = Repeat("PT1H", None, None)
    await ports.apply([ScheduleTimer("acme", "rec", at(-1).replace(microsecond=0), None, None, every)])
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    (held,) = batch.result.claimed
    # A claim's batch in flight holds it: the pause, and a resume, wait for it (offered again later).
    assert (await ports.pause(pause(key="rec"), at_seq(10))).outcomes == ["deferred"]
    assert (await ports.pause(pause(key="rec", resume=True), at_seq(11))).outcomes == ["deferred"]
    assert await batch.record([Fired(held, held.due_at + timedelta(hours=1), 1)], []) == 1
    # The resume sent after it finds nothing paused; the pause, back after it, changes nothing.
    assert (await ports.pause(pause(key="rec", resume=True), at_seq(11))).outcomes == ["ignored"]
    assert (await ports.pause(pause(key="rec"), at_seq(10))).outcomes == ["ignored"]
    assert await state_of(ports, "rec") == "Scheduled"

    # A newer pause applies (again when redelivered); an older resume then changes nothing.
    assert (await ports.pause(pause(key="rec"), at_seq(12))).outcomes == ["applied"]
    assert (await ports.pause(pause(key="rec"), at_seq(12))).outcomes == ["applied"]
    assert (await ports.pause(pause(key="rec", resume=True), at_seq(11))).outcomes == ["ignored"]
    assert await state_of(ports, "rec") == "Paused"
    # A ScheduleTimer earlier in the stream than the pause (deferred, say) still applies: stored
    # Paused, as any reschedule of a paused timer.
    moved = ScheduleTimer("acme", "rec", at(120).replace(microsecond=0), None, None, every)
    assert (await ports.apply([moved], [at_seq(5)])).outcomes == ["applied"]
    assert await state_of(ports, "rec") == "Paused"
    resumed = await ports.pause(pause(key="rec", resume=True), at_seq(13))
    assert resumed.outcomes == ["applied"] and resumed.soonest_due == moved.due_at
    assert await state_of(ports, "rec") == "Scheduled"
    # Cancelled and scheduled again: positions only grow, so a pause older than the last resume
    # (a replica that took it side by side) still changes nothing.
    assert (await ports.apply([CancelTimer("acme", "rec", None, None)], [at_seq(14)])).outcomes == ["applied"]
    assert (await ports.apply([dataclasses.replace(moved)], [at_seq(15)])).outcomes == ["applied"]
    assert (await ports.pause(pause(key="rec"), at_seq(12))).outcomes == ["ignored"]
    assert await state_of(ports, "rec") == "Scheduled"
    # A cancel ends a pause, so it takes its place among them: a pause sent before the cancel (it
    # waited behind a claim's batch) changes nothing when it comes back to the timer scheduled again.
    assert (await ports.pause(pause(key="rec"), at_seq(16))).outcomes == ["applied"]
    assert (await ports.apply([CancelTimer("acme", "rec", None, None)], [at_seq(18)])).outcomes == ["applied"]
    assert (await ports.apply([dataclasses.replace(moved)], [at_seq(19)])).outcomes == ["applied"]
    assert (await ports.pause(pause(key="rec"), at_seq(17))).outcomes == ["ignored"]
    assert await state_of(ports, "rec") == "Scheduled"


async def test_a_run_of_timers_pauses_and_resumes_of_many_tenants_applies_each_as_alone(ports: Ports) -> None:
    """Store.pause_timers: each command's outcome, in order, as Store.pause would give it alone:
    pauses and resumes mixed, any tenants', one older than its timer's last, one a claim holds."""
    start = at(-1).replace(microsecond=0)
    later = at(60).replace(microsecond=0)
    every = Repeat("PT1H", None, None)

    def timer(tenant: str, key: str, due: datetime) -> ScheduleTimer:
        return ScheduleTimer(tenant, key, due, None, None, every)

    await ports.apply([timer("acme", "held", start)])
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    assert [c.service_call_id for c in batch.result.claimed] == ["held"]
    await ports.apply([timer(t, k, later) for t in ("acme", "beta") for k in ("p", "r", "old")])
    earlier = [PauseTimers(t, k, False) for t in ("acme", "beta") for k in ("r", "old")]
    assert (await ports.pause_timers(earlier, [at_seq(10 + i) for i in range(4)])).outcomes == ["applied"] * 4
    assert await state_of(ports, "r") == "Paused"
    run = [
        PauseTimers("acme", "p", False),
        PauseTimers("beta", "r", True),
        PauseTimers("acme", "r", True),
        PauseTimers("beta", "old", True),  # older than its pause (seq 13): changes nothing
        PauseTimers("acme", "held", False),  # a claim's batch in flight holds it: waits
        PauseTimers("beta", "p", False),
        PauseTimers("acme", "nobody", True),
    ]
    seqs = [20, 21, 22, 5, 23, 24, 25]
    done = await ports.pause_timers(run, [at_seq(n) for n in seqs])
    assert done.outcomes == ["applied", "applied", "applied", "ignored", "deferred", "applied", "ignored"]
    assert done.soonest_due == later
    states = [await state_of(ports, k, t) for t in ("acme", "beta") for k in ("p", "r", "old")]
    assert states == ["Paused", "Scheduled", "Paused"] * 2
    assert await state_of(ports, "held") == "Scheduled"
    # As one at a time: the same run again (its redelivery) changes nothing more.
    again = await ports.pause_timers(run, [at_seq(n) for n in seqs])
    assert again.outcomes == ["applied", "ignored", "ignored", "ignored", "deferred", "applied", "ignored"]
    assert again.soonest_due is None
    await batch.close()


async def lose(ports: Ports, batch: ClaimedBatch, db_url: str) -> None:
    """End a batch's session under it, as a kill or a dropped connection does: its claim is rolled
    back (Postgres: once the session is gone, which pg_terminate_backend only asks for)."""
    if isinstance(ports, TwinStore):
        assert isinstance(batch, TwinBatch)
        batch.roll_back()
        return
    (pid,) = query(
        db_url,
        "SELECT pid FROM pg_stat_activity"
        " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'",
    )[0]
    query(db_url, "SELECT pg_terminate_backend(%s)", pid)
    await until(
        lambda: query(db_url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", pid) == [],
        what="the batch's session to end",
    )


async def test_firings_whose_batch_was_lost_after_the_puback_are_recorded_again_once(
    ports: Ports, db_url: str
) -> None:
    """A one-shot timer ends Reached, and a recurring one moves to its next occurrence exactly
    once, however often the record is made again."""
    start = at(-1).replace(microsecond=0)
    every = ScheduleTimer("acme", "tick", start, None, 1, Repeat("PT1H", None, None))
    await ports.apply([schedule("once", -1), every])
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    claimed = {c.service_call_id: c for c in batch.result.claimed}
    fired = [Fired(claimed["once"], None, None), Fired(claimed["tick"], start + timedelta(hours=1), 1)]
    await lose(ports, batch, db_url)
    with pytest.raises(TransientError):
        await batch.record(fired, [])
    await batch.close()
    assert await ports.record_again(fired) == 2
    assert await ports.record_again(fired) == 0  # the rows hold the next occurrence, or none
    assert [await state_of(ports, k) for k in ("once", "tick")] == ["Reached", "Scheduled"]
    assert (await ports.apply([schedule("once", 60, ts=2)])).outcomes == ["ignored"]  # Reached is final
    (nxt,) = (
        await claim_closed(ports, claim_params("b", 10, 0, lease_ms=10_000, ahead_ms=3_700_000))
    ).claimed
    assert (nxt.service_call_id, nxt.due_at, nxt.occurrence_index, nxt.attempts) == (
        "tick",
        start + timedelta(hours=1),
        1,
        1,
    )


async def test_the_record_made_again_leaves_what_a_command_or_another_claim_took_since(
    ports: Ports, db_url: str
) -> None:
    """Between the rollback and the record made again: a reschedule applied to the unclaimed row
    (it wins: the record made again changes nothing), another replica's batch in flight (its row is locked; it
    re-publishes with the same id and records it), a claim ended unrecorded (its lease holds it)."""
    await ports.apply([schedule("moved", -3), schedule("flight", -2), schedule("leased", -1)])
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    fired = [Fired(c, None, None) for c in batch.result.claimed]
    await lose(ports, batch, db_url)
    with pytest.raises(TransientError):
        await batch.record(fired, [])
    await batch.close()
    assert (await ports.apply([schedule("moved", 60, ts=2)])).outcomes == ["applied"]
    flight = await ports.claim(claim_params("b", 1, 0, lease_ms=10_000, ahead_ms=100))  # oldest first
    assert [c.service_call_id for c in flight.result.claimed] == ["flight"]
    assert [c.service_call_id for c in await claim_one(ports, "c")] == ["leased"]
    assert await ports.record_again(fired) == 0
    assert [await state_of(ports, k) for k in ("moved", "flight", "leased")] == ["Scheduled"] * 3
    (held,) = flight.result.claimed
    assert await flight.record([Fired(held, None, None)], []) == 1
    (moved,) = (
        await claim_closed(ports, claim_params("d", 10, 0, lease_ms=10_000, ahead_ms=120_000))
    ).claimed
    assert moved.service_call_id == "moved" and moved.due_at > at(30)  # its new dueAt, not fired


async def test_a_label_selector_names_its_tenants_pending_timers_in_key_order_after_a_cursor(
    ports: Ports,
) -> None:
    t0 = datetime.now(UTC)
    bf, gold = {"campaign": "bf"}, {"campaign": "bf", "tier": "gold"}

    def labelled(tenant: str, key: str, labels: dict[str, str] | None) -> ScheduleTimer:
        return dataclasses.replace(schedule(key, 60), tenant_id=tenant, labels=labels)

    timers = [labelled("acme", k, gold if k in ("b", "d") else bf) for k in ("a", "b", "c", "d", "e")]
    await ports.apply([*timers, labelled("acme", "none", None), labelled("other", "b", gold)])
    await ports.apply([CancelTimer("acme", "e", None, None)])
    # A timer the selector names, scheduled again later in the stream than the action: left alone.
    await ports.apply([labelled("acme", "c", bf)], [Position(20, t0)])
    action = BulkAction("acme", bf, "pause")
    at_10 = Position(10, t0)
    assert await ports.select_labelled(action, at_10, "", 10) == ["a", "b", "d"]
    assert await ports.select_labelled(action, at_10, "a", 1) == ["b"]
    assert await ports.select_labelled(action, None, "", 10) == ["a", "b", "c", "d"]
    by_gold = BulkAction("acme", gold, "pause")
    assert await ports.select_labelled(by_gold, None, "", 10) == ["b", "d"]
    # A chunk's pause: the timers still carrying the selector, each as its own pause.
    paused = await ports.pause_listed(by_gold, ["a", "b", "d", "missing"], at_10)
    assert paused.outcomes == ["applied", "applied"]
    assert [await state_of(ports, k) for k in ("a", "b", "d")] == ["Scheduled", "Paused", "Paused"]
    resumed = await ports.pause_listed(dataclasses.replace(by_gold, kind="resume"), ["b", "d"], at_10)
    assert resumed.outcomes == ["applied", "applied"] and resumed.soonest_due == timers[1].due_at
    assert await state_of(ports, "b") == "Scheduled"


async def test_an_occurrences_first_expiry_decision_stands_across_a_rolled_back_claim(
    ports: Ports, db_url: str
) -> None:
    """The claim that decided is rolled back (its session gone): the next claim of that very
    occurrence gets the first decision back, whatever it proposes; another occurrence of the
    same timer is decided afresh."""
    start = at(-1).replace(microsecond=0)
    every = ScheduleTimer("acme", "tick", start, None, 1, Repeat("PT1H", None, None), expire_after="PT1S")
    await ports.apply([dataclasses.replace(schedule("once", -1), expire_after="PT1S"), every])
    batch = await ports.claim(claim_params("a", 10, 0, lease_ms=10_000, ahead_ms=100))
    claimed = sorted(batch.result.claimed, key=lambda c: c.service_call_id)
    assert await ports.decide_expiry(claimed, {("acme", "tick")}) == {("acme", "tick")}
    await lose(ports, batch, db_url)
    await batch.close()
    again = await ports.claim(claim_params("b", 10, 0, lease_ms=10_000, ahead_ms=100))
    reclaimed = again.result.claimed
    assert sorted(c.service_call_id for c in reclaimed) == ["once", "tick"]
    assert await ports.decide_expiry(reclaimed, {("acme", "once")}) == {("acme", "tick")}
    await again.close()
    (tick,) = [c for c in reclaimed if c.service_call_id == "tick"]
    nxt = tick._replace(due_at=start + timedelta(hours=1), occurrence_index=1)
    assert await ports.decide_expiry([nxt], set()) == set()
