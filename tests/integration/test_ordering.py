"""Command order: for each timer, the end state is that of applying its commands in timestampMs
order, whatever order they arrive in; without timestampMs, in stream order, a command deferred
behind a claimed occurrence included (README, "Guarantees"; docs/CONTRACT.md, Ordering)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from tests.helpers import consumer_idle, jetstream, publish_raw, query, running_replica, until
from worker.adapters.postgres.store import Store
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
    assert (await store.apply([ScheduleTimer("acme", "a", due(0), "second", 30, None)])).outcomes == [
        "applied"
    ]
    assert state_of(db_url, "a") == ("Scheduled", due(0), "second", 30)


async def test_a_restatement_keeps_a_recurring_timers_progress(store: Store, db_url: str) -> None:
    hourly = Repeat("PT1H", None, None)
    await store.apply([ScheduleTimer("acme", "r", due(0), None, 10, hourly)])
    # Three occurrences fired since (what record_fired leaves behind).
    query(
        db_url,
        "UPDATE timers SET occurrence_index = 3, due_at = due_at + interval '3 hours'"
        " WHERE service_call_id = 'r'",
    )
    copy = ScheduleTimer("acme", "r", due(0), None, 10, hourly)
    assert (await store.apply([copy])).outcomes == ["ignored"]  # a redelivered copy writes nothing
    assert (await store.apply([ScheduleTimer("acme", "r", due(0), "new", 40, hourly)])).outcomes == [
        "applied"
    ]
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


@dataclass(frozen=True)
class Step:
    kind: str  # "schedule" (recurring, hourly, so a firing leaves it Scheduled) or "cancel"
    slot: int  # which dueAt, for a schedule


# Per key: commands before its occurrence is claimed (the last one a schedule, so there is one to
# claim), commands sent while it is claimed (deferred), commands sent right after it is recorded.
Phases = tuple[list[Step], list[Step], list[Step]]
step = st.builds(Step, st.sampled_from(["schedule", "cancel"]), st.integers(0, 2))
phases = st.tuples(
    st.builds(lambda a, last: [*a, Step("schedule", last)], st.lists(step, max_size=2), st.integers(0, 2)),
    st.lists(step, min_size=1, max_size=3),
    # Sent back to back: the two replicas fetch them side by side and may commit them in either
    # order; the later one in the stream must still win.
    st.lists(step, min_size=1, max_size=3),
)


def plain(tenant: str, key: str, s: Step) -> dict[str, object]:
    """A command without timestampMs: only its place in the stream orders it."""
    payload: dict[str, object] = {"tenantId": tenant, "serviceCallId": key}
    if s.kind == "schedule":
        payload["dueAt"] = due(s.slot).isoformat().replace("+00:00", "Z")
        payload["repeat"] = {"every": "PT1H"}
    return payload


def deferred_so_far() -> float:
    return sum(
        REGISTRY.get_sample_value("timer_commands_applied_total", {"kind": k, "outcome": "deferred"}) or 0.0
        for k in ("schedule", "cancel")
    )


async def test_without_timestamps_commands_apply_in_stream_order_across_a_crashed_firing(
    settings: Settings, db_url: str
) -> None:
    """The property without timestampMs (issue 19, defect 4): each timer ends as its commands
    applied in stream order, the claimed occurrence firing where it was claimed, when a replica
    crashed between publish and record, commands came in while the occurrence waited for its lease
    to run out (deferred), and more came right after another replica recorded it: a command
    deferred behind the occurrence is never overtaken by a later one. Commands sent back to back
    (before the claim and after the firing) are taken by both replicas side by side: the one
    earlier in the stream never overrides the later one (it is ignored if it commits last)."""
    loop = asyncio.get_running_loop()
    fast = settings.model_copy(update={"lease_ms": 1000, "publish_timeout_ms": 500, "poll_interval_ms": 200})

    async def send(js: object, keys: list[str], history: list[Phases], phase: int) -> int:
        sent = 0
        for key, steps in zip(keys, history, strict=True):
            for s in steps[phase]:
                await publish_raw(js, fast, "acme", s.kind, plain("acme", key, s))
                sent += 1
        return sent

    async def check(history: list[Phases]) -> None:
        run = uuid.uuid4().hex[:8]
        keys = [f"{run}-{k}" for k in range(len(history))]
        async with jetstream(fast) as js:
            await send(js, keys, history, 0)  # back to back, as phase 2: two replicas take them
            await until(lambda: consumer_idle(fast), what="first commands applied")
            for key, (before_claim, _, _) in zip(keys, history, strict=True):
                got = query(db_url, "SELECT state, anchor_due_at FROM timers WHERE service_call_id = %s", key)
                assert got == [("Scheduled", due(before_claim[-1].slot))], f"{key} first: {history}"
            # A replica claimed each occurrence, published it and died before the record.
            query(
                db_url,
                "UPDATE timers SET due_at = now() - interval '1 second',"
                " claimed_at = now() - interval '1 second',"
                " lease_owner = 'crashed', lease_token = nextval('timer_lease_token'), attempts = 1,"
                " lease_expires_at = now() + interval '1 hour' WHERE service_call_id = ANY(%s)",
                keys,
            )
            before = deferred_so_far()
            sent = await send(js, keys, history, 1)
            await until(
                lambda: deferred_so_far() - before >= sent, what="commands deferred behind the claims"
            )
            query(db_url, "UPDATE timers SET lease_expires_at = now() WHERE service_call_id = ANY(%s)", keys)
            await until(
                lambda: (
                    query(
                        db_url,
                        "SELECT count(*) FROM timers WHERE service_call_id = ANY(%s) AND fired_count = 1"
                        " AND lease_expires_at IS NULL",
                        keys,
                    )
                    == [(len(keys),)]
                ),
                what="the occurrences re-fired and recorded",
            )
            await send(js, keys, history, 2)  # at once: before the deferred ones come back
        await until(lambda: consumer_idle(fast), timeout=60, what="every command applied")
        for key, (_, during, after) in zip(keys, history, strict=True):
            last = [*during, *after][-1]
            want = ("Cancelled", None) if last.kind == "cancel" else ("Scheduled", due(last.slot))
            ((state, anchor),) = query(
                db_url, "SELECT state, anchor_due_at FROM timers WHERE service_call_id = %s", key
            )
            assert (state, anchor if state == "Scheduled" else None) == want, f"{key}: {history}"

    @given(st.lists(phases, min_size=1, max_size=2))
    @example([([Step("schedule", 0)], [Step("schedule", 1)], [Step("cancel", 0)])])  # the case
    @example([([Step("schedule", 0), Step("cancel", 0), Step("schedule", 1)], [Step("cancel", 0)],
                [Step("schedule", 2), Step("cancel", 0)])])  # fmt: skip
    @hypothesis_settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    def prop(history: list[Phases]) -> None:
        asyncio.run_coroutine_threadsafe(check(history), loop).result(timeout=120)

    async with running_replica(fast), running_replica(fast, worker_id="second"):
        await asyncio.to_thread(prop)
