"""A firing window end to end (docs/USING.md, Firing window), on real Postgres and NATS with a replica
in this process: each occurrence fires at its planned instant in [dueAt, dueAt + window], never
before it, the instant the one the fleet's secret plans, and the event says both."""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise

from tests.helpers import (
    due_events,
    iso_in,
    jetstream,
    message_ids,
    publish_raw,
    query,
    row,
    running_replica,
    until,
)
from worker.client import TimerClient
from worker.config import Settings
from worker.contract import firing_id
from worker.core.window import planned_at


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _ms(text: str) -> datetime:
    """An instant as events write it, to the millisecond (iso() truncates)."""
    at = _at(text)
    return at.replace(microsecond=at.microsecond // 1000 * 1000)


async def test_a_burst_fires_spread_over_its_window_and_never_before_each_planned_instant(
    settings: Settings, db_url: str
) -> None:
    ids = message_ids(db_url)
    due = iso_in(0.5, db_url)
    count = 40
    async with running_replica(settings), jetstream(settings) as js:
        for i in range(count):
            body = {"tenantId": "acme", "serviceCallId": f"b{i}", "dueAt": due, "window": "PT3S"}
            await publish_raw(js, settings, "acme", "schedule", body)
        events = await due_events(js, settings, count)
    planned_seen = set()
    for body, _ in events:
        p = body["payload"]
        planned = planned_at(ids, "acme", p["serviceCallId"], _at(due), "PT3S")
        # The event speaks of the nominal occurrence: its dueAt, and its id by that dueAt.
        assert _at(p["dueAt"]) == _ms(due)
        assert body["id"] == firing_id("acme", p["serviceCallId"], _at(due))
        assert _at(p["plannedAt"]) == _ms(planned.isoformat())
        assert _at(due) <= planned <= _at(due) + timedelta(seconds=3)
        # Never early: published at or after its planned instant, on the database clock.
        assert _at(p["reachedAt"]) >= _at(p["plannedAt"])
        planned_seen.add(p["plannedAt"])
    assert len({b["payload"]["serviceCallId"] for b, _ in events}) == count
    # Spread, not one instant: 40 draws from 3,001 milliseconds.
    assert len(planned_seen) > count * 3 // 4


async def test_each_occurrence_of_a_recurring_timer_is_planned_in_its_own_window(
    settings: Settings, db_url: str
) -> None:
    ids = message_ids(db_url)
    first = iso_in(0.3, db_url)
    body = {
        "tenantId": "acme",
        "serviceCallId": "rep",
        "dueAt": first,
        "repeat": {"every": "PT1S", "times": 4},
        "window": "PT0.8S",
    }
    async with running_replica(settings), jetstream(settings) as js:
        await publish_raw(js, settings, "acme", "schedule", body)
        events = await due_events(js, settings, 4)
        await until(
            lambda: (r := row(db_url, "acme", "rep")) is not None and r["state"] == "Reached",
            what="the fourth occurrence recorded",
        )
    dues = sorted(_at(b["payload"]["dueAt"]) for b, _ in events)
    # The occurrences are the nominal ones, a period apart, each with its own event id.
    assert [round((b - a).total_seconds(), 3) for a, b in pairwise(dues)] == [
        1.0,
        1.0,
        1.0,
    ]
    assert len({b["id"] for b, _ in events}) == 4
    offsets = set()
    for b, _ in events:
        p = b["payload"]
        nominal = _at(p["dueAt"])
        planned = planned_at(ids, "acme", "rep", _exact(first, nominal), "PT0.8S")
        assert _at(p["plannedAt"]) == _ms(planned.isoformat())
        assert nominal <= _at(p["plannedAt"]) <= nominal + timedelta(milliseconds=800)
        assert _at(p["reachedAt"]) >= _at(p["plannedAt"])
        offsets.add(_at(p["plannedAt"]) - nominal)
    assert len(offsets) > 1  # planned anew for each occurrence, not one offset for the timer


def _exact(first: str, nominal_ms: datetime) -> datetime:
    """The occurrence's dueAt to the microsecond: the first one's plus whole periods (the event
    writes milliseconds; the plan hashes the stored instant, rounded to a millisecond)."""
    start = _at(first)
    return start + timedelta(seconds=round((nominal_ms - _ms(first)).total_seconds()))


async def test_a_restatement_keeps_the_plan_and_a_new_window_plans_anew(
    settings: Settings, db_url: str, client: TimerClient
) -> None:
    ids = message_ids(db_url)
    due = _ms(iso_in(3600, db_url))  # the client sends milliseconds

    def stored() -> tuple[datetime, datetime | None, str | None]:
        ((due_at, nominal, window),) = query(
            db_url, "SELECT due_at, nominal_due_at, fire_window FROM timers WHERE service_call_id = 'w'"
        )
        return due_at, nominal, window

    async with running_replica(settings):
        await client.schedule("acme", "w", due, window=timedelta(minutes=10))
        await until(
            lambda: bool(query(db_url, "SELECT 1 FROM timers WHERE service_call_id = 'w'")), what="stored"
        )
        first = stored()
        assert first == (planned_at(ids, "acme", "w", due, "PT600S"), due, "PT600S")
        view = await client.get("acme", "w")
        assert view is not None
        assert _at(view["dueAt"]) == _ms(due.isoformat()) and view["window"] == "PT600S"
        assert _at(view["plannedAt"]) == _ms(first[0].isoformat())

        await client.schedule("acme", "w", due, window="PT1H")
        await until(lambda: stored()[2] == "PT1H", what="the new window applied")
        assert stored() == (planned_at(ids, "acme", "w", due, "PT1H"), due, "PT1H")

        await client.schedule("acme", "w", due)  # no window: due_at is dueAt again
        await until(lambda: stored()[2] is None, what="the window dropped")
        assert stored() == (due, None, None)
        view = await client.get("acme", "w")
        assert view is not None and "window" not in view and "plannedAt" not in view
