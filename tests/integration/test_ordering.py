"""Command order: for each timer, the end state is that of applying its commands in timestampMs
order, whatever order they arrive in (README, "Guarantees")."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from tests.helpers import consumer_idle, jetstream, publish_raw, query, running_replica, until
from worker.adapters.store import Store
from worker.config import Settings
from worker.contract import CancelTimer, Repeat, ScheduleTimer

# Nothing fires during these tests (and it is well inside TIMER_MAX_HORIZON).
FAR = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)


def due(slot: int) -> datetime:
    return FAR + timedelta(minutes=slot)


def state_of(db_url: str, key: str) -> tuple[str, datetime | None, str | None, int | None]:
    ((state, due_at, correlation, ts),) = query(
        db_url,
        "SELECT state, due_at, correlation_id, command_ts FROM timers"
        " WHERE tenant_id = 'acme' AND service_call_id = %s",
        key,
    )
    return state, due_at, correlation, ts


async def test_a_newer_restatement_outranks_an_older_cancel_delivered_after_it(
    store: Store, db_url: str
) -> None:
    # Schedule(ts 10), Schedule(ts 30), Cancel(ts 20): the newest command schedules the timer.
    for command in (
        ScheduleTimer("acme", "a", due(0), None, 10, None),
        ScheduleTimer("acme", "a", due(0), None, 30, None),
        CancelTimer("acme", "a", None, 20),
    ):
        await store.apply([command])
    assert state_of(db_url, "a") == ("Scheduled", due(0), None, 30)


async def test_a_restatement_delivered_early_keeps_a_stale_reschedule_out(store: Store, db_url: str) -> None:
    # Schedule(A, 10), Schedule(B, 20), Schedule(A, 30), delivered as 10, 30, 20: it fires at A.
    for command in (
        ScheduleTimer("acme", "a", due(0), None, 10, None),
        ScheduleTimer("acme", "a", due(0), None, 30, None),
        ScheduleTimer("acme", "a", due(1), None, 20, None),
    ):
        await store.apply([command])
    assert state_of(db_url, "a") == ("Scheduled", due(0), None, 30)


async def test_a_newer_correlation_id_with_the_same_due_at_is_recorded(store: Store, db_url: str) -> None:
    await store.apply([ScheduleTimer("acme", "a", due(0), "first", 10, None)])
    assert await store.apply([ScheduleTimer("acme", "a", due(0), "second", 30, None)]) == ["applied"]
    assert state_of(db_url, "a") == ("Scheduled", due(0), "second", 30)


async def test_a_restatement_keeps_a_recurring_timers_progress(store: Store, db_url: str) -> None:
    hourly = Repeat("PT1H", None, None)
    await store.apply([ScheduleTimer("acme", "r", due(0), None, 10, hourly)])
    # Three occurrences fired since (what mark_fired leaves behind).
    query(
        db_url,
        "UPDATE timers SET occurrence_index = 3, due_at = due_at + interval '3 hours'"
        " WHERE service_call_id = 'r'",
    )
    copy = ScheduleTimer("acme", "r", due(0), None, 10, hourly)
    assert await store.apply([copy]) == ["ignored"]  # a redelivered copy writes nothing
    assert await store.apply([ScheduleTimer("acme", "r", due(0), "new", 40, hourly)]) == ["applied"]
    assert query(db_url, "SELECT occurrence_index, due_at, correlation_id, command_ts FROM timers") == [
        (3, due(180), "new", 40)
    ]


@dataclass(frozen=True)
class Sent:
    key: int
    kind: str  # "schedule" or "cancel"
    ts: int
    slot: int  # which dueAt, for a schedule; few slots, so restatements are common
    correlation: str | None


@st.composite
def arrivals(draw: st.DrawFn) -> list[Sent]:
    """A few keys' histories with distinct timestamps per key, in a random arrival order."""
    sent: list[Sent] = []
    for key in range(draw(st.integers(1, 4))):
        stamps = draw(st.lists(st.integers(1, 10_000), min_size=1, max_size=6, unique=True))
        for ts in stamps:
            kind = draw(st.sampled_from(["schedule", "cancel"]))
            sent.append(
                Sent(key, kind, ts, draw(st.integers(0, 2)), draw(st.sampled_from([None, "c1", "c2"])))
            )
    return list(draw(st.permutations(sent)))


def expected(history: list[Sent]) -> tuple[str, datetime | None, str | None, int]:
    """Applied in timestamp order, the newest command decides (no dueAt is near: nothing fires)."""
    last = max(history, key=lambda s: s.ts)
    if last.kind == "cancel":
        return "Cancelled", None, None, last.ts
    return "Scheduled", due(last.slot), last.correlation, last.ts


def body(tenant: str, key: str, sent: Sent) -> dict[str, object]:
    payload: dict[str, object] = {"tenantId": tenant, "serviceCallId": key}
    if sent.kind == "schedule":
        payload["dueAt"] = due(sent.slot).isoformat().replace("+00:00", "Z")
    if sent.correlation is not None:
        payload["correlationId"] = sent.correlation
    kind = "ScheduleTimer" if sent.kind == "schedule" else "CancelTimer"
    return {"type": kind, "tenantId": tenant, "timestampMs": sent.ts, "payload": payload}


async def test_any_arrival_order_ends_as_timestamp_order_through_intake(
    settings: Settings, db_url: str
) -> None:
    """The property, through two replicas' intake (each takes its own batches) and Postgres."""
    loop = asyncio.get_running_loop()

    async def check(sent: list[Sent]) -> None:
        run = uuid.uuid4().hex[:8]
        async with jetstream(settings) as js:
            for s in sent:
                await publish_raw(js, settings, "acme", s.kind, body("acme", f"{run}-{s.key}", s))
        await until(lambda: consumer_idle(settings), what="commands applied")
        for key in {s.key for s in sent}:
            history = [s for s in sent if s.key == key]
            state, due_at, correlation, ts = state_of(db_url, f"{run}-{key}")
            want = expected(history)
            got = (
                state,
                due_at if state == "Scheduled" else None,
                correlation if state == "Scheduled" else None,
                ts,
            )
            assert got == want, f"key {key}: {history}"

    @given(arrivals())
    @hypothesis_settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    def prop(sent: list[Sent]) -> None:
        asyncio.run_coroutine_threadsafe(check(sent), loop).result(timeout=60)

    async with running_replica(settings), running_replica(settings, worker_id="second"):
        await asyncio.to_thread(prop)
