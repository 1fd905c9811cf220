"""Batches that are not full in flight beside the next claim (firing.CLAIM_SPACING_S): a stop and
a hard stop with two of them out, how often such claims go, a recurring timer catching up
through them, and the loop on the database clock's real estimate (DbClock), not a fake."""

from __future__ import annotations

import asyncio
import time as systime
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from tests.helpers import until
from tests.twins import FakeClock, FakeTime, TwinBatch, TwinPublisher, TwinStore, event_id
from worker.config import Settings
from worker.contract import Repeat, ScheduleTimer
from worker.core.clock import DbClock
from worker.core.domain import LOOKAHEAD_MS, ClaimParams, Failed, Fired
from worker.core.firing import CLAIM_SPACING_S, PIPELINE_DEPTH, FiringLoop
from worker.core.ports import ClaimedBatch
from worker.core.wakeup import Wakeup
from worker.errors import DatabaseError
from worker.settings import load_settings

# As in test_firing: in memory, a claim the pipeline failed to hold back signals within a few turns.
NO_CLAIM_WITHIN_S = 0.2


@pytest.fixture
def time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def settings() -> Settings:
    return load_settings(worker_id="unit", batch_size=100, lease_ms=3000, publish_timeout_ms=500)


def firing(
    settings: Settings, store: TwinStore, publisher: TwinPublisher, clock: FakeClock | DbClock
) -> FiringLoop:
    return FiringLoop(settings, store, publisher, Wakeup(clock, LOOKAHEAD_MS / 1000), clock)


async def two_windows_held(
    settings: Settings, time: FakeTime
) -> tuple[TwinStore, TwinPublisher, asyncio.Queue[str], asyncio.Event, asyncio.Task[None]]:
    """A running loop with two batches that are not full in flight, both held at the publisher."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    start = time.t
    await store.apply(
        [
            ScheduleTimer("acme", f"t{i}", time.dt() + timedelta(seconds=0.01 * i), None, None, None)
            for i in range(1, 60)  # one every 10 ms, never a full batch
        ]
    )
    publisher.gate = asyncio.Event()
    loop = firing(settings, store, publisher, FakeClock(time))
    claims: asyncio.Queue[str] = asyncio.Queue()
    loop.test_signal = claims.put_nowait
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    for _ in range(PIPELINE_DEPTH):
        await asyncio.wait_for(claims.get(), timeout=5)
    await until(
        lambda: any(c.at > start + 0.1 for c in publisher.calls), what="the second window on the wire"
    )
    assert len(store.open) == PIPELINE_DEPTH
    return store, publisher, claims, stop, task


async def test_a_stop_with_two_batches_in_flight_ends_both_and_claims_no_more(
    settings: Settings, time: FakeTime
) -> None:
    """The stop waits for the batches out (their PubAcks, then their records), records nothing
    before its PubAck, and no claim goes out after it."""
    store, publisher, claims, stop, task = await two_windows_held(settings, time)
    try:
        stop.set()
        with pytest.raises(TimeoutError):  # held by its batches, as it must be
            await asyncio.wait_for(asyncio.shield(task), timeout=NO_CLAIM_WITHIN_S)
        assert all(r.state == "Scheduled" for r in store.rows.values()), "recorded before its PubAck"
        claimed = {k for k, r in store.rows.items() if r.lease_expires_at is not None}
        publisher.gate.set()
        await asyncio.wait_for(task, timeout=5)
    finally:
        publisher.gate.set()
        stop.set()
        await task
    assert claims.empty(), "a claim after the stop"
    assert store.open == []
    assert {k for k, r in store.rows.items() if r.state == "Reached"} == claimed
    assert all(r.lease_expires_at is None for r in store.rows.values() if r.state == "Scheduled")
    sent = [event_id(m) for c in publisher.calls for m in c.messages]
    assert sorted(sent) == sorted(set(sent)) and len(sent) == len(claimed)


async def test_a_hard_stop_with_two_batches_in_flight_ends_them_at_once_and_records_nothing(
    settings: Settings, time: FakeTime
) -> None:
    """Cancelling the loop (the replica's hard stop) cancels both publishes and closes both
    batches: nothing is recorded without its PubAck, and the claims stay until their lease ends."""
    store, publisher, claims, _, task = await two_windows_held(settings, time)
    claimed = {k for k, r in store.rows.items() if r.lease_expires_at is not None}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5)
    publisher.gate.set()  # a PubAck now reaches no one
    assert store.open == []
    assert not [name for name, _ in store.log if name in ("record_fired", "retry_later")]
    assert all(r.state == "Scheduled" for r in store.rows.values())
    assert {k for k, r in store.rows.items() if r.lease_owner == "unit"} == claimed
    assert claims.empty() and not publisher.stored


async def test_a_recurring_timer_catching_up_fires_each_occurrence_once_and_in_order(
    settings: Settings, time: FakeTime
) -> None:
    """Every occurrence is overdue: each comes due again while the batch that fired the one
    before may still be out. Its row is held by that batch, so none fires twice or out of turn."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    first = time.dt() - timedelta(seconds=10)
    await store.apply([ScheduleTimer("acme", "r", first, None, None, Repeat("PT1S", 6, None))])
    stop = asyncio.Event()
    task = asyncio.create_task(firing(settings, store, publisher, FakeClock(time)).run(stop))
    try:
        await until(lambda: store.rows["acme", "r"].state == "Reached", what="all six occurrences")
    finally:
        stop.set()
        await task
    sent = [event_id(m) for c in publisher.calls for m in c.messages]
    ms = round(first.timestamp() * 1000)
    assert sent == [f"acme:r:{ms + 1000 * i}" for i in range(6)]


async def test_on_the_real_clock_claims_keep_their_spacing_and_at_most_the_pipeline_is_open(
    settings: Settings,
) -> None:
    """The loop as it runs, on DbClock over a twin on the wall clock: a trickle of timers, none
    ever early, each once; claims that are not full go no closer than CLAIM_SPACING_S apart
    (no hot loop over rows its own batches hold), with at most PIPELINE_DEPTH - 1 batches open
    as the next claim goes out (and with it, the connections a replica holds)."""
    store, publisher = TwinStore(systime.time), TwinPublisher(systime.time)
    now = datetime.now(UTC)
    due = {f"t{i}": now + timedelta(seconds=0.1 + 0.025 * i) for i in range(40)}
    await store.apply([ScheduleTimer("acme", k, d, None, None, None) for k, d in due.items()])
    loop = firing(settings, store, publisher, DbClock())
    open_at_claim: list[int] = []
    claim = store.claim

    async def counted(params: ClaimParams) -> ClaimedBatch:
        open_at_claim.append(len(store.open))
        return await claim(params)

    store.claim = counted  # type: ignore[method-assign]
    stop = asyncio.Event()
    started = systime.monotonic()
    task = asyncio.create_task(loop.run(stop))
    try:
        await until(lambda: all(r.state == "Reached" for r in store.rows.values()), what="all fired")
        elapsed = systime.monotonic() - started
    finally:
        stop.set()
        await task
    assert max(open_at_claim) <= PIPELINE_DEPTH - 1
    assert len(open_at_claim) <= 1 + elapsed / CLAIM_SPACING_S, (len(open_at_claim), elapsed)
    sent = [(event_id(m), c.at) for c in publisher.calls for m in c.messages]
    assert sorted(k.split(":")[1] for k, _ in sent) == sorted(due)
    for key, at in sent:
        assert at >= due[key.split(":")[1]].timestamp(), f"{key} published early"


async def test_a_fatal_error_of_a_batch_in_flight_ends_the_loop_at_once_not_at_the_next_claim(
    settings: Settings, time: FakeTime
) -> None:
    """The batch fires beside the loop, which meanwhile sleeps until the next claim (a poll
    interval here: nothing else is scheduled). An error no retry fixes ends the loop when it
    happens, through the task group, not when the loop next looks at its batches."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    await store.apply([ScheduleTimer("acme", "t0", time.dt() + timedelta(seconds=0.05), None, None, None)])
    claim = store.claim

    async def mark_refused(params: ClaimParams) -> TwinBatch:
        batch = await claim(params)

        async def record(fired: Sequence[Fired], failed: Sequence[Failed]) -> int:
            raise DatabaseError("record_fired: column timers.reached_at does not exist")

        batch.record = record  # type: ignore[method-assign]
        return batch

    store.claim = mark_refused  # type: ignore[method-assign]
    slow = settings.model_copy(update={"poll_interval_ms": 60_000})
    loop = firing(slow, store, publisher, FakeClock(time))
    with pytest.raises(DatabaseError, match="reached_at"):
        await asyncio.wait_for(loop.run(asyncio.Event()), timeout=5)
    assert len(publisher.stored) == 1
