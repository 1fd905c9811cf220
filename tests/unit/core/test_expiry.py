"""Expiry (worker/core/expiry.py): expireAfter as a tenant may write it, which occurrences are too
late to fire (never one on time), their DLQ entry, and the firing loop recording them unfired."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from tests.helpers import property_settings
from tests.twins import FakeClock, FakeTime, TwinPublisher, TwinStore
from worker.config import Settings
from worker.contract import MessageIds, Repeat, ScheduleTimer, Subjects, firing_id
from worker.core.domain import LOOKAHEAD_MS, Claimed
from worker.core.expiry import (
    MAX_EXPIRE_AFTER_MS,
    MIN_EXPIRE_AFTER_MS,
    expire_after_ms,
    expired_entry,
    expiring,
    honour,
    missed,
)
from worker.core.firing import FiringLoop
from worker.core.wakeup import Wakeup
from worker.errors import TransientError
from worker.settings import load_settings

SECRET = b"a fleet secret of thirty-two b.."
IDS = MessageIds(SECRET)
DUE = datetime(2026, 11, 23, 9, 0, 0, 123000, tzinfo=UTC)


def occurrence(key: str, due: datetime, expire_after: str | None, nominal: datetime | None = None) -> Claimed:
    return Claimed(
        "acme", key, due, None, 7, 1, None, None, None, due, 0, due, "(0,1)",
        nominal_due_at=nominal, expire_after=expire_after,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "ms"), [("PT1S", 1000), ("PT1H", 3_600_000), ("P7D", MAX_EXPIRE_AFTER_MS), ("PT1.5S", 1500)]
)
def test_expire_after_is_a_second_to_a_week(text: str, ms: int) -> None:
    assert expire_after_ms(text) == ms


@pytest.mark.parametrize("text", ["PT0S", "PT0.999S", "P8D", "P7DT0.001S", "P1M", "-PT1H", "1h", ""])
def test_anything_else_is_refused_naming_expire_after(text: str) -> None:
    with pytest.raises(ValueError, match="expireAfter"):
        expire_after_ms(text)


@property_settings(1000)
@given(st.text(max_size=100))
def test_any_text_is_a_bounded_expiry_or_refused(text: str) -> None:
    try:
        ms = expire_after_ms(text)
    except ValueError:
        return
    assert MIN_EXPIRE_AFTER_MS <= ms <= MAX_EXPIRE_AFTER_MS


@property_settings(1000)
@given(late_ms=st.integers(0, 10_000_000), seconds=st.integers(1, 7 * 86_400))
def test_an_occurrence_expires_only_when_later_than_its_expire_after(late_ms: int, seconds: int) -> None:
    c = occurrence("x", DUE, f"PT{seconds}S")
    keep, gone = expiring([c], DUE + timedelta(milliseconds=late_ms))
    assert (gone == [c]) == (late_ms > seconds * 1000) and (keep == [c]) == (late_ms <= seconds * 1000)


def test_lateness_counts_from_the_planned_instant_of_a_window() -> None:
    # Planned ten minutes into its window: a minute after it is not two minutes late.
    planned = DUE + timedelta(minutes=10)
    c = occurrence("w", planned, "PT2M", nominal=DUE)
    assert expiring([c], planned + timedelta(minutes=1)) == ([c], [])
    assert expiring([c], planned + timedelta(minutes=3)) == ([], [c])


def test_without_expiry_or_with_an_unreadable_one_nothing_expires() -> None:
    plain, broken = occurrence("p", DUE, None), occurrence("b", DUE, "one hour")
    assert expiring([plain, broken], DUE + timedelta(days=30)) == ([plain, broken], [])


def test_the_dlq_entry_says_which_occurrence_how_late_and_why() -> None:
    planned = DUE + timedelta(seconds=30)
    out = expired_entry(
        occurrence("bday", planned, "PT1H", nominal=DUE), Subjects("svc"), "PT1H", 3_725_004, IDS
    )
    event_id = firing_id("acme", "bday", DUE)
    assert out.subject == "svc.acme.timer.dlq"
    assert json.loads(out.payload) == {
        "type": "ExpiredOccurrence",
        "id": event_id,
        "tenantId": "acme",
        "serviceCallId": "bday",
        "correlationId": None,
        "dueAt": "2026-11-23T09:00:00.123Z",
        "plannedAt": "2026-11-23T09:00:30.123Z",
        "expireAfter": "PT1H",
        "lateMs": 3_725_004,
    }
    # Pinned: a re-publish of the entry (by this release or the next) is dropped as a duplicate.
    pinned = hmac.new(SECRET, f"expired\0{event_id}".encode(), hashlib.sha256).hexdigest()[:32]
    assert out.headers == {
        "Timer-Error": "expired",
        "Timer-Error-Detail": "not published within expireAfter PT1H: 3725004 ms late",
        "Timer-Subject": "svc.acme.timer.due",
        "Nats-Msg-Id": pinned,
    }


@pytest.fixture
def settings() -> Settings:
    return load_settings(worker_id="unit", batch_size=100, lease_ms=3000, publish_timeout_ms=500)


async def test_the_firing_loop_sends_an_expired_occurrence_to_the_dlq_and_records_it_unfired(
    settings: Settings,
) -> None:
    time = FakeTime()
    store, publisher = TwinStore(time), TwinPublisher(time)
    due = time.dt() - timedelta(seconds=90)  # a replica was down past its expiry
    await store.apply(
        [
            ScheduleTimer("acme", "once", due, None, None, None, expire_after="PT1M"),
            ScheduleTimer("acme", "every", due, None, None, Repeat("PT1H", None, None), expire_after="PT1M"),
            ScheduleTimer("acme", "fresh", due, None, None, None, expire_after="PT2M"),
        ]
    )
    before = REGISTRY.get_sample_value("timer_expired_total") or 0.0
    clock = FakeClock(time)
    await FiringLoop(settings, store, publisher, Wakeup(clock, LOOKAHEAD_MS / 1000), clock).tick()
    sent: dict[str, list[str]] = {}
    for call in publisher.calls:
        for m in call.messages:
            body = json.loads(m.payload)  # a DueTimeReached's ids are in its payload
            sent.setdefault(m.subject, []).append(body.get("payload", body)["serviceCallId"])
    assert sorted(sent["timer.acme.timer.dlq"]) == ["every", "once"]
    assert sent["timer.acme.timer.due"] == ["fresh"]  # within its two minutes: it fires, late
    rows = store.rows
    assert rows["acme", "once"].state == "Expired" and rows["acme", "once"].fired_count == 0
    every = rows["acme", "every"]
    assert every.state == "Scheduled" and every.due_at == due + timedelta(hours=1) and every.fired_count == 0
    assert rows["acme", "fresh"].state == "Reached"
    assert (REGISTRY.get_sample_value("timer_expired_total") or 0.0) - before == 2


def test_a_missed_occurrence_is_skipped_only_under_catchup_none() -> None:
    # claim_due moved the reference past the dueAt: downtime. On time, it is never past it.
    late = Claimed(
        "acme", "n", DUE, None, 7, 1, "PT1H", None, None, DUE, 3, DUE + timedelta(hours=2), "(0,1)",
        repeat_catchup="none",
    )  # fmt: skip
    on_time, one = late._replace(recurrence_ref=DUE), late._replace(repeat_catchup=None)
    assert missed([late, on_time, one]) == ([on_time, one], [late])


async def test_after_downtime_catchup_none_skips_what_was_missed_and_one_fires_it(settings: Settings) -> None:
    time = FakeTime()
    store, publisher = TwinStore(time), TwinPublisher(time)
    due = time.dt() - timedelta(minutes=150)  # missed at -150 min, -90 min and -30 min
    every = Repeat("PT1H", None, None)
    none, one = (Repeat("PT1H", None, None, catchup=c) for c in ("none", "one"))
    await store.apply(
        [
            ScheduleTimer("acme", "none", due, None, None, none),
            ScheduleTimer("acme", "one", due, None, None, one),
            ScheduleTimer("acme", "default", due, None, None, every),
        ]
    )
    before = REGISTRY.get_sample_value("timer_catchup_skipped_total") or 0.0
    clock = FakeClock(time)
    await FiringLoop(settings, store, publisher, Wakeup(clock, LOOKAHEAD_MS / 1000), clock).tick()
    fired = sorted(
        json.loads(m.payload)["payload"]["serviceCallId"] for c in publisher.calls for m in c.messages
    )
    assert fired == ["default", "one"]  # "one" is the default: the awaited occurrence fires, late
    for key in ("none", "one", "default"):  # and each goes on to its first occurrence after now
        r = store.rows["acme", key]
        assert r.state == "Scheduled" and r.due_at == due + timedelta(hours=3), key
    assert store.rows["acme", "none"].fired_count == 0
    assert (REGISTRY.get_sample_value("timer_catchup_skipped_total") or 0.0) - before == 1


def test_the_decision_that_stands_says_which_occurrences_expire() -> None:
    late, on_time, plain = (
        occurrence("late", DUE, "PT1S"),
        occurrence("on", DUE, "PT1S"),
        occurrence("p", DUE, None),
    )
    # "late" was decided to fire by a claim rolled back after its PubAck; "on" expired before.
    assert honour([on_time, plain], [late], {("acme", "on")}) == ([plain, late], [on_time])


class Crash(Exception):
    """The replica died here: its claim's transaction rolled back."""


async def test_an_occurrence_published_before_a_crash_fires_again_and_never_expires(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PubAck came, the replica died before its commit, and the next claim comes once the
    expireAfter has passed: the occurrence fires again under the same id (the stream drops it),
    no ExpiredOccurrence of that id is sent, and each timer records one firing."""
    time = FakeTime()
    store, publisher = TwinStore(time), TwinPublisher(time)
    due = time.dt() - timedelta(milliseconds=500)
    every = Repeat("PT1H", None, None)
    await store.apply(
        [
            ScheduleTimer("acme", "once", due, None, None, None, expire_after="PT1S"),
            ScheduleTimer("acme", "every", due, None, None, every, expire_after="PT1S"),
        ]
    )

    def crash(point: str) -> None:
        if point == "published":
            for batch in list(store.open):
                batch.roll_back()
            raise Crash

    clock = FakeClock(time)
    monkeypatch.setattr("worker.core.publishing.crash_point", crash)
    with pytest.raises(Crash):
        await FiringLoop(settings, store, publisher, Wakeup(clock, LOOKAHEAD_MS / 1000), clock).tick()
    assert [m.subject for m in publisher.stored.values()] == ["timer.acme.timer.due"] * 2
    monkeypatch.undo()
    time.t += 3  # the next claim, past the expiry
    await FiringLoop(settings, store, publisher, Wakeup(clock, LOOKAHEAD_MS / 1000), clock).tick()
    sent = [m for call in publisher.calls for m in call.messages]
    assert {m.subject for m in sent} == {"timer.acme.timer.due"}, "an ExpiredOccurrence went out"
    assert len(sent) == 4 and len(publisher.stored) == 2  # sent again, under the same ids
    once, hourly = store.rows["acme", "once"], store.rows["acme", "every"]
    assert (once.state, once.fired_count) == ("Reached", 1)
    assert (hourly.state, hourly.fired_count, hourly.due_at) == ("Scheduled", 1, due + timedelta(hours=1))


async def test_an_expiry_decision_that_cannot_be_recorded_publishes_nothing_of_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    time = FakeTime()
    store, publisher = TwinStore(time), TwinPublisher(time)
    due = time.dt() - timedelta(milliseconds=500)
    await store.apply(
        [
            ScheduleTimer("acme", "expiring", due, None, None, None, expire_after="PT1S"),
            ScheduleTimer("acme", "plain", due, None, None, None),
        ]
    )

    async def gone(due: object, expired: object) -> set[tuple[str, str]]:
        raise TransientError("postgres: connection lost")

    monkeypatch.setattr(store, "decide_expiry", gone)
    clock = FakeClock(time)
    await FiringLoop(settings, store, publisher, Wakeup(clock, LOOKAHEAD_MS / 1000), clock).tick()
    fired = [json.loads(m.payload)["payload"]["serviceCallId"] for m in publisher.stored.values()]
    assert fired == ["plain"]
    expiring_row = store.rows["acme", "expiring"]
    assert expiring_row.state == "Scheduled" and "expiry decision" in (expiring_row.last_error or "")
