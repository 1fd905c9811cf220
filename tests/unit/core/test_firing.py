"""The firing loop on twins (tests/twins.py): what only the chaos suite used to reach."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from datetime import timedelta

import pytest
from prometheus_client import REGISTRY

from tests.helpers import until
from tests.twins import FakeClock, FakeTime, TwinPublisher, TwinStore, claim_params, event_id
from worker.config import Settings
from worker.contract import Repeat, ScheduleTimer
from worker.core.budget import TenantBudgets, TimeBudget
from worker.core.domain import LOOKAHEAD_MS, Fired
from worker.core.fireable import NEXT_BURST_S, NEXT_SHARE, POSTPONE_MS, RETRY_BACKOFF_MS
from worker.core.firing import PIPELINE_DEPTH, FiringLoop
from worker.core.wakeup import Wakeup
from worker.errors import TransientError
from worker.settings import load_settings


@pytest.fixture
def time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def settings() -> Settings:
    return load_settings(worker_id="unit", batch_size=100, lease_ms=3000, publish_timeout_ms=500)


def firing(settings: Settings, store: TwinStore, publisher: TwinPublisher, clock: FakeClock) -> FiringLoop:
    return FiringLoop(settings, store, publisher, Wakeup(clock, LOOKAHEAD_MS / 1000), clock)


async def schedule(store: TwinStore, time: FakeTime, *offsets_s: float, tenant: str = "acme") -> None:
    await store.apply(
        [
            ScheduleTimer(tenant, f"t{i}", time.dt() + timedelta(seconds=s), None, None, None)
            for i, s in enumerate(offsets_s)
        ]
    )


# How long a negative check waits for a claim that must not come. Everything here is in memory,
# so a claim that the pipeline failed to hold back would signal within a few loop turns.
NO_CLAIM_WITHIN_S = 0.2


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def test_nothing_is_published_before_its_due_time_on_the_database_clock(
    settings: Settings, time: FakeTime
) -> None:
    """Claims reach LOOKAHEAD_MS ahead; what they take early waits for its dueAt on the database
    clock, however early the loop's sleeps wake up and however far behind the estimate is."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    clock = FakeClock(time, behind_s=0.002, early_s=0.005)
    await schedule(store, time, -1.0, 0.0, 0.01, 0.03, 0.05, 0.0999)
    await firing(settings, store, publisher, clock).tick()
    sent = [(event_id(m), call.at) for call in publisher.calls for m in call.messages]
    assert len(sent) == 6  # every one claimed in this tick was published in it
    due = {
        f"acme:{r.service_call_id}:{round(r.anchor_due_at.timestamp() * 1000)}": r.anchor_due_at.timestamp()
        for r in store.rows.values()
        if r.anchor_due_at is not None
    }
    for msg_id, at in sent:
        assert at >= due[msg_id], f"{msg_id} published {(due[msg_id] - at) * 1000:.1f} ms early"
    assert all(r.state == "Reached" for r in store.rows.values())


async def test_each_due_instant_goes_out_without_waiting_for_the_pubacks_of_the_one_before(
    settings: Settings, time: FakeTime
) -> None:
    """A claim reaches ahead over several due instants: each is published when it comes, while
    the PubAcks of those before are still awaited; nothing is recorded until all are in."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    await schedule(store, time, 0.01, 0.02, 0.03)
    publisher.gate = asyncio.Event()  # no PubAck until set
    task = asyncio.create_task(firing(settings, store, publisher, FakeClock(time)).tick())
    try:
        await until(lambda: len(publisher.calls) == 3, what="all three instants on the wire at once")
        assert [len(c.messages) for c in publisher.calls] == [1, 1, 1]
        assert all(r.state == "Scheduled" for r in store.rows.values()), "recorded before its PubAck"
        publisher.gate.set()
        await task
    finally:
        publisher.gate.set()
        await task
    assert all(r.state == "Reached" for r in store.rows.values())


async def test_while_claims_come_back_full_the_next_claim_overlaps_the_publishes_before_it(
    settings: Settings, time: FakeTime
) -> None:
    """A backlog drains with PIPELINE_DEPTH batches publishing at once, never more, and all of it."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    await schedule(store, time, *(-60.0 + i / 1000 for i in range(10)))  # older than the fresh lane's window
    publisher.gate = asyncio.Event()
    loop = firing(settings.model_copy(update={"batch_size": 2}), store, publisher, FakeClock(time))
    claims: asyncio.Queue[str] = asyncio.Queue()
    loop.test_signal = claims.put_nowait
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        await until(lambda: len(publisher.calls) == PIPELINE_DEPTH, what="the first batches on the wire")
        assert [claims.get_nowait() for _ in range(PIPELINE_DEPTH)] == ["claimed"] * PIPELINE_DEPTH
        # The negative check: a claim more would signal at once (the store and publisher are
        # in-memory); none comes while every batch in flight is held at the publisher.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(claims.get(), timeout=NO_CLAIM_WITHIN_S)
        assert len(publisher.calls) == PIPELINE_DEPTH
        assert sum(r.lease_expires_at is not None for r in store.rows.values()) == 2 * PIPELINE_DEPTH
        publisher.gate.set()
        await until(
            lambda: all(r.state == "Reached" for r in store.rows.values()), what="the backlog drained"
        )
    finally:
        publisher.gate.set()  # a failed check above must not leave the loop held forever
        stop.set()
        await task
    assert sorted(event_id(m) for c in publisher.calls for m in c.messages) == sorted(
        f"acme:t{i}:{round((time.dt() + timedelta(seconds=-60 + i / 1000)).timestamp() * 1000)}"
        for i in range(10)
    )


async def test_while_timers_keep_coming_due_the_next_claim_goes_out_before_the_batch_before_ends(
    settings: Settings, time: FakeTime
) -> None:
    """A claim reaches LOOKAHEAD_MS ahead and its batch lasts until its last occurrence is due:
    the next claim must not wait for that batch to be acknowledged and recorded, or what comes
    due between the two is late by a record and a claim. At most PIPELINE_DEPTH are in flight."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    start = time.t
    await schedule(store, time, *(0.01 * i for i in range(1, 60)))  # one every 10 ms, never a full batch
    publisher.gate = asyncio.Event()  # no PubAck, so no batch ends, until set
    loop = firing(settings, store, publisher, FakeClock(time))
    claims: asyncio.Queue[str] = asyncio.Queue()
    loop.test_signal = claims.put_nowait
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        for _ in range(PIPELINE_DEPTH):
            await asyncio.wait_for(claims.get(), timeout=5)
        await until(
            lambda: any(c.at > start + 0.1 for c in publisher.calls), what="the second window on the wire"
        )
        with pytest.raises(TimeoutError):  # both held at the publisher: no claim more
            await asyncio.wait_for(claims.get(), timeout=NO_CLAIM_WITHIN_S)
        assert all(r.state == "Scheduled" for r in store.rows.values()), "recorded before its PubAck"
        publisher.gate.set()
        await until(lambda: all(r.state == "Reached" for r in store.rows.values()), what="all fired")
    finally:
        publisher.gate.set()
        stop.set()
        await task
    assert len({event_id(m) for c in publisher.calls for m in c.messages}) == 59


async def test_first_attempts_go_in_one_atomic_batch_and_retries_one_by_one(
    settings: Settings, time: FakeTime
) -> None:
    """A retry may be in the stream already, which would fail a whole atomic batch: so retries go
    through publish_many (deduplicated per message), first attempts in one publish_atomic."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    clock = FakeClock(time)
    await schedule(store, time, -3.0, -2.0, -1.0)
    stopped = await store.claim(claim_params("stopped", 2, 0, lease_ms=1000))  # t0, t1
    await stopped.close()  # its replica stopped: the lease, committed, holds them until it runs out
    time.t += 1.5  # its lease ran out
    await firing(settings, store, publisher, clock).tick()
    by_method = {c.method: sorted(event_id(m).split(":")[1] for m in c.messages) for c in publisher.calls}
    assert by_method == {"atomic": ["t2"], "many": ["t0", "t1"]}
    assert len(publisher.calls) == 2


def stall_past(settings: Settings, time: FakeTime) -> Callable[[], None]:
    """A PubAck that takes longer than the lease: Postgres ends the claim's session
    (idle_in_transaction_session_timeout is the lease) and rolls the claim back."""

    def stall() -> None:
        time.t += settings.lease_ms / 1000 + 0.1

    return stall


async def test_a_batch_whose_transaction_ended_after_its_puback_is_recorded_again_at_once(
    settings: Settings, time: FakeTime, caplog: pytest.LogCaptureFixture
) -> None:
    """The record in the claim's transaction fails, and that error still reaches the loop; the
    acknowledged firings are recorded in a transaction of their own, so a command arriving next
    meets them fired (a reschedule of a one-shot timer is ignored), not as if never claimed."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    await schedule(store, time, -2.0, -1.0)
    publisher.on_publish = stall_past(settings, time)
    recorded = counter("timer_marked_total")
    with pytest.raises(TransientError, match="idle-in-transaction"):
        await firing(settings, store, publisher, FakeClock(time)).tick()
    assert counter("timer_marked_total") - recorded == 2
    assert [r.state for r in store.rows.values()] == ["Reached", "Reached"]
    assert [name for name, _ in store.log].count("record_fired_again") == 1
    (again,) = [r for r in caplog.records if getattr(r, "action", None) == "recorded_again"]
    assert (getattr(again, "count", None), getattr(again, "marked", None)) == (2, 2)
    assert len(publisher.stored) == 2


async def test_a_batch_recorded_after_another_replica_took_its_rows_changes_nothing(
    settings: Settings, time: FakeTime
) -> None:
    """Another replica claimed the rows once the lease ran out (their batch in flight): neither
    the first record nor the one made again touches them; that replica re-publishes (deduplicated by
    the same Nats-Msg-Id) and records them."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    await schedule(store, time, -2.0, -1.0)
    publisher.gate = asyncio.Event()
    tick = asyncio.create_task(firing(settings, store, publisher, FakeClock(time)).tick())
    try:
        await until(lambda: len(publisher.calls) == 1, what="the batch's publish on the wire")
        time.t += settings.lease_ms / 1000 + 0.1  # the PubAck took longer than the lease
        other = await store.claim(claim_params("other", 10, 0, lease_ms=settings.lease_ms))
        assert len(other.result.claimed) == 2
    finally:
        publisher.gate.set()
    recorded = counter("timer_marked_total")
    with pytest.raises(TransientError, match="idle-in-transaction"):
        await tick
    assert counter("timer_marked_total") - recorded == 0
    assert [(r.state, r.lease_owner) for r in store.rows.values()] == [("Scheduled", "other")] * 2
    assert await other.record([Fired(c, None, None) for c in other.result.claimed], []) == 2


async def test_a_record_made_again_that_fails_is_logged_and_the_batchs_error_goes_on(
    settings: Settings, time: FakeTime, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database gone for the second transaction too: the rows stay as the rollback left them
    (another claim fires them again, deduplicated), and the loop sees the batch's error."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    await schedule(store, time, -1.0)
    publisher.on_publish = stall_past(settings, time)

    async def gone(fired: Sequence[Fired]) -> int:
        raise TransientError("postgres: connection refused")

    monkeypatch.setattr(store, "record_again", gone)
    with pytest.raises(TransientError, match="idle-in-transaction"):
        await firing(settings, store, publisher, FakeClock(time)).tick()
    assert [r.state for r in store.rows.values()] == ["Scheduled"]
    (failed,) = [r for r in caplog.records if getattr(r, "action", None) == "record_again_failed"]
    assert getattr(failed, "error", None) == "TransientError: postgres: connection refused"


async def test_a_failed_publish_is_released_for_a_retry_not_marked(
    settings: Settings, time: FakeTime
) -> None:
    store, publisher = TwinStore(time), TwinPublisher(time)
    clock = FakeClock(time)
    await schedule(store, time, -2.0, -1.0)
    publisher.fail = lambda m: TimeoutError("no PubAck") if ":t0:" in event_id(m) else None
    await firing(settings, store, publisher, clock).tick()
    t0, t1 = store.rows["acme", "t0"], store.rows["acme", "t1"]
    assert (t1.state, t0.state) == ("Reached", "Scheduled")
    assert t0.lease_owner is None and t0.last_error == "publish: TimeoutError: no PubAck"
    assert t0.lease_expires_at == pytest.approx(time.t + RETRY_BACKOFF_MS / 1000)
    # Not before the back-off:
    assert not (await store.claim(claim_params("other", 10, 0, lease_ms=1000))).result.claimed
    time.t += RETRY_BACKOFF_MS / 1000 + 0.001
    (again,) = (await store.claim(claim_params("other", 10, 0, lease_ms=1000))).result.claimed
    assert (again.service_call_id, again.attempts) == ("t0", 2)


async def test_recurring_rows_met_while_the_next_occurrence_budget_is_spent_wait_for_a_later_claim(
    settings: Settings, time: FakeTime
) -> None:
    """Work whose cost a tenant chooses (a next occurrence that takes milliseconds) has a budget per
    second and tenant: a recurring row met while its tenant's is overdrawn is put back unfired,
    with no error, for POSTPONE_MS; the one-shot timers of its batch, and another tenant's
    recurring ones, fire at once."""
    store, publisher = TwinStore(time), TwinPublisher(time)
    clock = FakeClock(time)
    due = time.dt() - timedelta(seconds=1)
    await store.apply(
        [
            ScheduleTimer("acme", "minutely", due, None, None, Repeat(None, None, None, cron="* * * * *")),
            ScheduleTimer("globex", "once", due, None, None, None),
            ScheduleTimer("globex", "hourly", due, None, None, Repeat("PT1H", None, None)),
        ]
    )
    loop = firing(settings, store, publisher, clock)
    loop.next_budget = TenantBudgets(NEXT_SHARE, NEXT_BURST_S, 1.0, 10.0, now=lambda: time.t)
    loop.next_budget.charge("acme", NEXT_BURST_S + 0.15)  # overdrawn by 0.15 s: paid back in 1.5 s
    postponed = REGISTRY.get_sample_value("timer_postponed_total", {"reason": "next_occurrence"}) or 0
    await loop.tick()
    minutely, once = store.rows["acme", "minutely"], store.rows["globex", "once"]
    assert once.state == "Reached"
    assert store.rows["globex", "hourly"].occurrence_index == 1  # acme's debt is not globex's
    assert (minutely.state, minutely.occurrence_index, minutely.last_error) == ("Scheduled", 0, None)
    assert not [m for m in publisher.stored.values() if ":minutely:" in event_id(m)]
    assert minutely.lease_expires_at == pytest.approx(time.t + POSTPONE_MS / 1000)
    assert (
        REGISTRY.get_sample_value("timer_postponed_total", {"reason": "next_occurrence"}) or 0
    ) == postponed + 1
    # Once the budget is paid back and the hold over, it fires.
    time.t += POSTPONE_MS / 1000 + 0.001
    assert not loop.next_budget.ready("acme", costly=True)  # the hold is over, the debt not yet paid
    await loop.tick()
    assert minutely.occurrence_index == 0  # put back again
    time.t += POSTPONE_MS / 1000 + 0.001
    await loop.tick()
    assert (minutely.occurrence_index, minutely.state) == (1, "Scheduled")
    assert [m for m in publisher.stored.values() if ":minutely:" in event_id(m)]


def test_a_time_budget_refills_at_its_share_up_to_its_burst() -> None:
    now = [0.0]
    budget = TimeBudget(0.1, 0.2, now=lambda: now[0])
    budget.charge(0.15)
    assert budget.ready()  # 0.05 left
    budget.charge(0.25)  # one piece overdraws it: 0.2 of debt
    assert not budget.ready()
    now[0] += 1.9
    assert not budget.ready()  # 0.19 paid back
    now[0] += 0.2
    assert budget.ready()
    now[0] += 100
    budget.charge(0.2)
    assert not budget.ready()  # saved up no more than the burst
    budget.charge(-1)  # work under the free allowance charges nothing
    assert not budget.ready()


def test_tenant_budgets_are_apart_and_forgotten_once_full() -> None:
    now = [0.0]
    budgets = TenantBudgets(0.1, 0.2, 1.0, 10.0, now=lambda: now[0])
    budgets.charge("acme", 0.5)
    budgets.charge("globex", 0.0)  # nothing charged: no budget kept
    assert not budgets.ready("acme", costly=False) and budgets.ready("globex", costly=True)
    assert len(budgets) == 1
    now[0] += 5.0  # acme's debt paid back, its burst saved up again
    budgets.charge("globex", 0.01)
    assert len(budgets) == 1 and budgets.ready("acme", costly=False)  # acme's, full, forgotten
    with pytest.raises(ValueError):
        TenantBudgets(0.0, 0.1, 1.0, 1.0)
    with pytest.raises(ValueError):
        TenantBudgets(0.1, 0.1, 0.0, 1.0)


def test_what_all_tenants_overdraw_holds_back_their_cron_rows_only() -> None:
    """Forty tenants each within its own budget still add up: the total puts off the rows that
    may cost milliseconds (cron), and never an `every` row (at most ~0.1 ms) or a one-shot."""
    now = [0.0]
    budgets = TenantBudgets(0.1, 0.1, 0.25, 0.25, now=lambda: now[0])
    for k in range(4):
        budgets.charge(f"t{k}", 0.09)  # each within its own tenth, together over the quarter
    assert all(budgets.ready(f"t{k}", costly=False) for k in range(4))
    assert not budgets.ready("t0", costly=True) and not budgets.ready("calm", costly=True)
    assert budgets.ready("calm", costly=False)
    now[0] += 0.5  # 0.11 of debt paid back at a quarter a second: 0.44 s
    assert budgets.ready("calm", costly=True)
