"""Bulk actions through intake (worker/core/bulk.py, Intake.apply; docs/CONTRACT.md, Labels): every
pending timer of the tenant carrying the selector, a chunk at a time behind a cursor, each as its own
command at the action's place in the stream; never another tenant's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from tests.twins import TwinStore
from tests.unit.core.test_intake import command, fetch_and_handle, setup
from worker.core import bulk


def labelled(tenant: str, key: str, due: datetime, labels: dict[str, str], ts: int = 1) -> dict[str, Any]:
    body = command("ScheduleTimer", tenant, key, due, ts)
    body["payload"]["labels"] = labels
    return body


def states(store: TwinStore, tenant: str) -> dict[str, str]:
    return {k: r.state for (t, k), r in sorted(store.rows.items()) if t == tenant}


async def test_a_cancel_by_labels_cancels_the_tenants_timers_carrying_every_pair_and_no_other() -> None:
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    bf = {"campaign": "bf", "tier": "gold"}
    for tenant in ("acme", "other"):  # the other tenant carries the very same labels
        broker.add(s.of(tenant, "schedule"), labelled(tenant, "a", due, bf))
        broker.add(s.of(tenant, "schedule"), labelled(tenant, "b", due, {"campaign": "bf"}))  # one pair only
        broker.add(s.of(tenant, "schedule"), labelled(tenant, "c", due, {**bf, "x": "y"}))
        broker.add(s.of(tenant, "schedule"), command("ScheduleTimer", tenant, "d", due))  # no labels
    await fetch_and_handle(broker, intake)
    cancel = broker.add(s.of("acme", "cancel"), {"tenantId": "acme", "labels": bf})
    await fetch_and_handle(broker, intake)
    assert states(store, "acme") == {"a": "Cancelled", "b": "Scheduled", "c": "Cancelled", "d": "Scheduled"}
    assert set(states(store, "other").values()) == {"Scheduled"}
    assert broker.acks.of(cancel.metadata.sequence.stream) == ["+ACK"]


async def test_a_schedule_later_in_the_stream_than_the_cancel_is_left_alone() -> None:
    """The action runs after its batch's commands (as a tenant's pause), yet each timer takes it at
    its own place in the stream: one scheduled after it, in the same batch, survives it."""
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    broker.add(s.of("acme", "schedule"), labelled("acme", "before", due, {"c": "1"}))
    broker.add(s.of("acme", "cancel"), {"tenantId": "acme", "labels": {"c": "1"}})
    broker.add(s.of("acme", "schedule"), labelled("acme", "after", due, {"c": "1"}))
    await fetch_and_handle(broker, intake)
    assert states(store, "acme") == {"after": "Scheduled", "before": "Cancelled"}


async def test_a_big_selection_goes_a_chunk_at_a_time_each_chunk_after_the_last(monkeypatch: Any) -> None:
    monkeypatch.setattr(bulk, "BULK_CHUNK", 3)
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    for i in range(14):
        broker.add(s.of("acme", "schedule"), labelled("acme", f"k{i:02d}", due, {"c": "1"}))
    await fetch_and_handle(broker, intake)
    pause = broker.add(s.of("acme", "pause"), {"tenantId": "acme", "labels": {"c": "1"}})
    await intake.handle(await broker.fetch(100, 1.0))
    assert await intake.lane.step()  # the first chunk; the lane holds the rest, unanswered
    assert list(states(store, "acme").values()).count("Paused") == 3
    assert broker.acks.of(pause.metadata.sequence.stream) == []
    while await intake.lane.step():
        pass
    assert set(states(store, "acme").values()) == {"Paused"}
    assert broker.acks.of(pause.metadata.sequence.stream) == ["+ACK"]
    # Every chunk started after the last key of the one before: none read a key twice.
    afters = [entry[1][1] for entry in store.log if entry[0] == "select_labelled"]
    assert afters == ["", "k02", "k05", "k08", "k11"]


async def test_a_resume_by_labels_ends_only_those_timers_own_pauses() -> None:
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    broker.add(s.of("acme", "schedule"), labelled("acme", "a", due, {"c": "1"}))
    broker.add(s.of("acme", "schedule"), labelled("acme", "b", due, {"c": "2"}))
    for key in ("a", "b"):
        broker.add(s.of("acme", "pause"), {"tenantId": "acme", "serviceCallId": key})
    await fetch_and_handle(broker, intake)
    broker.add(s.of("acme", "resume"), {"tenantId": "acme", "labels": {"c": "1"}})
    await fetch_and_handle(broker, intake)
    assert states(store, "acme") == {"a": "Scheduled", "b": "Paused"}


async def test_a_tenants_selector_acts_on_its_own_timers_only() -> None:
    """A tenant's cancel by labels reaches its own timers, never those of a tenant whose timers carry
    the same pairs; naming the other tenant is refused (tenant_mismatch) and changes nothing."""
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    for tenant in ("acme", "evil"):
        broker.add(s.of(tenant, "schedule"), labelled(tenant, "x", due, {"c": "1"}))
    await fetch_and_handle(broker, intake)
    broker.add(s.of("evil", "cancel"), {"tenantId": "acme", "labels": {"c": "1"}})
    await fetch_and_handle(broker, intake)
    assert states(store, "acme") == {"x": "Scheduled"} and states(store, "evil") == {"x": "Scheduled"}
    broker.add(s.of("evil", "cancel"), {"tenantId": "evil", "labels": {"c": "1"}})
    await fetch_and_handle(broker, intake)
    assert states(store, "acme") == {"x": "Scheduled"} and states(store, "evil") == {"x": "Cancelled"}
    asked = {entry[1][0].tenant_id for entry in store.log if entry[0] == "select_labelled"}
    assert asked == {"evil"}
