"""The bulk lane (worker/core/lane.py) through intake, on twins: commands on many timers never hold
up another command, tenants take turns a chunk at a time, a moot pause or resume costs nothing, a
held command is signalled in progress, and past its bounds a command comes back later."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

from tests.unit.core.test_bulk import labelled, states
from tests.unit.core.test_intake import command, fetch_and_handle, setup
from worker.adapters.jetstream import streams
from worker.core import bulk, lane


async def test_another_tenants_schedule_is_applied_and_acknowledged_before_any_bulk_step() -> None:
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    for i in range(5):
        broker.add(s.of("acme", "schedule"), labelled("acme", f"k{i}", due, {"g": "1"}))
    await fetch_and_handle(broker, intake)
    store.log.clear()
    broker.add(s.of("acme", "pause"), {"tenantId": "acme", "labels": {"g": "1"}})
    broker.add(s.of("acme", "pause"), {"tenantId": "acme"})
    bob = broker.add(s.of("bob", "schedule"), command("ScheduleTimer", "bob", "b", due))
    await intake.handle(await broker.fetch(100, 1.0))
    assert [kind for kind, _ in store.log] == ["apply", "ack"]  # no bulk work ran yet
    assert broker.acks.of(bob.metadata.sequence.stream) == ["+ACK"]
    assert len(intake.lane) == 2


async def test_a_flood_of_pauses_and_resumes_of_one_selector_runs_only_the_newest() -> None:
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    broker.add(s.of("acme", "schedule"), labelled("acme", "k", due, {"g": "1"}))
    await fetch_and_handle(broker, intake)
    store.log.clear()
    flood = [
        broker.add(s.of("acme", "pause" if i % 2 else "resume"), {"tenantId": "acme", "labels": {"g": "1"}})
        for i in range(200)
    ]
    tenant = [broker.add(s.of("acme", kind), {"tenantId": "acme"}) for kind in ("pause", "resume", "pause")]
    for _ in range(3):  # every batch before the lane's first step
        await intake.handle(await broker.fetch(100, 1.0))
    while await intake.lane.step():
        pass
    assert sum(1 for kind, _ in store.log if kind == "select_labelled") == 1
    assert sum(1 for kind, c in store.log if kind == "pause" and c.service_call_id is None) == 1
    assert states(store, "acme") == {"k": "Paused"}  # the newest of each: a pause
    for msg in flood + tenant:
        assert broker.acks.of(msg.metadata.sequence.stream) == ["+ACK"]


async def test_an_older_delivery_of_a_held_selector_is_acknowledged_without_work() -> None:
    _time, _store, broker, intake = setup()
    s = broker.subjects
    old = broker.add(s.of("acme", "pause"), {"tenantId": "acme", "labels": {"g": "1"}})
    new = broker.add(s.of("acme", "resume"), {"tenantId": "acme", "labels": {"g": "1"}})
    await intake.handle(await broker.fetch(1, 1.0))
    await intake.handle(await broker.fetch(1, 1.0))
    broker.redeliver(old)  # comes back, as after a replica's crash, while the newer one is held
    await intake.handle(await broker.fetch(1, 1.0))
    assert len(intake.lane) == 1
    assert broker.acks.of(old.metadata.sequence.stream) == ["+ACK", "+ACK"]
    while await intake.lane.step():
        pass
    assert broker.acks.of(new.metadata.sequence.stream) == ["+ACK"]


async def test_tenants_take_turns_a_chunk_each(monkeypatch: Any) -> None:
    monkeypatch.setattr(bulk, "BULK_CHUNK", 2)
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    for tenant in ("big", "small"):
        for i in range(8 if tenant == "big" else 2):
            broker.add(s.of(tenant, "schedule"), labelled(tenant, f"k{i}", due, {"g": "1"}))
    await fetch_and_handle(broker, intake)
    store.log.clear()
    for tenant in ("big", "small"):
        broker.add(s.of(tenant, "cancel"), {"tenantId": tenant, "labels": {"g": "1"}})
    await fetch_and_handle(broker, intake)
    turns = [c[0].tenant_id for kind, c in store.log if kind == "select_labelled"]
    assert turns[:4] == ["big", "small", "big", "small"]  # small's done in its second turn
    assert set(states(store, "small").values()) == {"Cancelled"}


async def test_past_a_tenants_share_a_command_is_refused_to_the_dlq_at_once() -> None:
    """Acknowledged, not held or offered again: no tenant's commands fill the consumer's ack pending."""
    _time, _store, broker, intake = setup()
    s = broker.subjects
    held = [
        broker.add(s.of("acme", "cancel"), {"tenantId": "acme", "labels": {"g": str(i)}})
        for i in range(lane.HELD_PER_TENANT)
    ]
    over = broker.add(s.of("acme", "cancel"), {"tenantId": "acme", "labels": {"g": "over"}})
    other = broker.add(s.of("bob", "cancel"), {"tenantId": "bob", "labels": {"g": "1"}})
    await intake.handle(await broker.fetch(100, 1.0))
    assert len(intake.lane) == lane.HELD_PER_TENANT + 1  # bob's has its own share
    assert broker.acks.of(over.metadata.sequence.stream) == ["+ACK"]
    [copy] = broker.stored.values()
    assert copy.subject == s.of("acme", "dlq") and copy.headers["Timer-Error"] == "bulk_backlog"
    while await intake.lane.step():
        pass
    for msg in [*held, other]:
        assert broker.acks.of(msg.metadata.sequence.stream) == ["+ACK"]


async def test_a_command_that_met_a_claimed_timer_stays_held_and_starts_over_later(monkeypatch: Any) -> None:
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    broker.add(s.of("acme", "schedule"), labelled("acme", "k", due, {"g": "1"}))
    await fetch_and_handle(broker, intake)
    outcomes = iter(["deferred", "applied"])
    pause_listed = store.pause_listed

    async def claimed_once(*args: Any) -> Any:
        done = await pause_listed(*args)
        return type(done)([next(outcomes)], done.soonest_due)

    store.pause_listed = claimed_once  # type: ignore[method-assign]
    pause = broker.add(s.of("acme", "pause"), {"tenantId": "acme", "labels": {"g": "1"}})
    await intake.handle(await broker.fetch(100, 1.0))
    assert await intake.lane.step()
    assert not await intake.lane.step()  # not due again before a lease
    assert len(intake.lane) == 1 and broker.acks.of(pause.metadata.sequence.stream) == []
    monkeypatch.setattr(lane.time, "monotonic", lambda: float("inf"))
    assert await intake.lane.step()
    assert broker.acks.of(pause.metadata.sequence.stream) == ["+ACK"]
    afters = [c[1] for kind, c in store.log if kind == "select_labelled"]
    assert afters == ["", ""]  # the second pass from the start


async def test_a_held_command_is_signalled_in_progress_during_a_step_and_offered_again_on_stop(
    monkeypatch: Any,
) -> None:
    monkeypatch.setattr(lane, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(bulk, "BULK_CHUNK", 1)
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    for i in range(3):
        broker.add(s.of("acme", "schedule"), labelled("acme", f"k{i}", due, {"g": "1"}))
    await fetch_and_handle(broker, intake)
    pause = broker.add(s.of("acme", "pause"), {"tenantId": "acme", "labels": {"g": "1"}})
    await intake.handle(await broker.fetch(100, 1.0))
    selecting, gate, select = asyncio.Event(), asyncio.Event(), store.select_labelled

    async def held_select(*args: Any) -> list[str]:
        selecting.set()
        await gate.wait()
        return await select(*args)

    store.select_labelled = held_select  # type: ignore[method-assign]
    signalled, publish = asyncio.Event(), broker.acks.publish

    async def watched(subject: str, payload: bytes = b"", **kw: Any) -> None:
        await publish(subject, payload, **kw)
        if payload == b"+WPI":
            signalled.set()

    broker.acks.publish = watched  # type: ignore[method-assign]
    stop = asyncio.Event()
    running = asyncio.create_task(intake.lane.run(stop))
    await selecting.wait()
    await signalled.wait()  # while the step still waits: progress does not wait for steps
    stop.set()  # mid-step: the step ends, then the lane lets go of what it holds
    gate.set()
    await running
    assert list(states(store, "acme").values()) == ["Paused", "Scheduled", "Scheduled"]
    answers = broker.acks.of(pause.metadata.sequence.stream)
    assert answers[0] == "+WPI" and answers[-1] == "-NAK" and "+ACK" not in answers
    assert len(intake.lane) == 0


def test_a_held_command_is_signalled_well_inside_the_command_consumers_ack_wait() -> None:
    assert lane.PROGRESS_EVERY_S <= streams.ACK_WAIT_S / 3


async def test_a_command_redelivered_while_held_is_held_once_and_answered_on_its_newest_delivery() -> None:
    _time, store, broker, intake = setup()
    s = broker.subjects
    cancel = broker.add(s.of("acme", "cancel"), {"tenantId": "acme", "labels": {"g": "1"}})
    await intake.handle(await broker.fetch(1, 1.0))
    again = broker.redeliver(cancel)
    await intake.handle(await broker.fetch(1, 1.0))
    assert len(intake.lane) == 1
    while await intake.lane.step():
        pass
    assert broker.acks.of(again.metadata.sequence.stream) == ["+ACK"]
    assert sum(1 for kind, _ in store.log if kind == "select_labelled") == 1
