"""The DueTimeReached event body: valid JSON with exactly the fields docs/CONTRACT.md names, whatever
the ids."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from worker.contract import MessageIds, due_event, firing_id, iso
from worker.core.domain import Claimed

IDS = MessageIds(b"a fleet secret of thirty-two b..")


def claimed(service_call_id: str, correlation_id: str | None) -> Claimed:
    due = datetime(2026, 11, 23, 9, 0, 0, 123456, tzinfo=UTC)
    return Claimed("acme", service_call_id, due, correlation_id, 7, 1, None, None, None, due, 0, due, "(0,1)")


@pytest.mark.parametrize(
    ("service_call_id", "correlation_id"),
    [
        ("plain-1", None),
        ('quote"back\\slash', "corr/1"),
        ("zero\u200bwidth é 日本", 'tab\tnew\nline "x"'),
        ("emoji \U0001f600", ""),
    ],
)
def test_the_event_is_the_json_the_spec_describes(service_call_id: str, correlation_id: str | None) -> None:
    timer = claimed(service_call_id, correlation_id)
    reached = datetime(2026, 11, 23, 9, 0, 1, 5000, tzinfo=UTC)
    out = due_event(timer, "svc.acme.timer.due", iso(reached), round(reached.timestamp() * 1000), IDS)
    msg_id = firing_id("acme", service_call_id, timer.due_at)
    assert json.loads(out.payload) == {
        "id": msg_id,
        "type": "DueTimeReached",
        "tenantId": "acme",
        "correlationId": correlation_id,
        "timestampMs": 1795424401005,
        "payload": {
            "tenantId": "acme",
            "serviceCallId": service_call_id,
            "dueAt": "2026-11-23T09:00:00.123Z",
            "reachedAt": "2026-11-23T09:00:01.005Z",
        },
    }
    assert out.headers == {"Nats-Msg-Id": IDS.event(msg_id)}
    assert out.subject == "svc.acme.timer.due"


@pytest.mark.parametrize(
    ("due", "expected"),
    [
        (datetime(1, 1, 1, tzinfo=UTC), "0001-01-01T00:00:00.000Z"),
        (
            datetime(2026, 3, 1, 0, 30, 0, 999999, tzinfo=timezone(timedelta(hours=1))),
            "2026-02-28T23:30:00.999Z",
        ),
        (datetime(9999, 12, 31, 23, 59, 59, 1000, tzinfo=UTC), "9999-12-31T23:59:59.001Z"),
    ],
)
def test_iso_is_rfc3339_utc_with_milliseconds(due: datetime, expected: str) -> None:
    assert iso(due) == expected


def test_a_firing_s_nats_msg_id_is_the_same_on_every_replica_and_unknowable_without_the_secret() -> None:
    """Issue 19, defect 1: the envelope id is public; the Nats-Msg-Id must not be derivable from it."""
    due = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)
    envelope = firing_id("victim", "sc-1", due)
    same_fleet = MessageIds(b"a fleet secret of thirty-two b..")
    other_fleet = MessageIds(b"another fleet's secret, 32 bytes")
    msg_id = IDS.event(envelope)
    assert msg_id == same_fleet.event(envelope), "another replica re-publishes with the same id"
    assert msg_id != other_fleet.event(envelope), "the id depends on the secret"
    assert envelope not in msg_id and len(msg_id) == 32 and int(msg_id, 16) >= 0  # 128 bits, hex
    assert IDS.event(firing_id("victim", "sc-1", due + timedelta(milliseconds=1))) != msg_id


def test_a_derived_id_is_new_for_a_recreated_stream_and_the_same_for_a_redelivery() -> None:
    """Issue 19, defect 3: sequence 1 of a recreated stream is another message (another time)."""
    stored = datetime(2026, 11, 23, 9, 0, 0, 123456, tzinfo=UTC)
    copy = IDS.derived("TIMER_COMMANDS", 1, stored)
    assert copy == IDS.derived("TIMER_COMMANDS", 1, stored.astimezone(timezone(timedelta(hours=2))))
    assert copy != IDS.derived("TIMER_COMMANDS", 1, stored + timedelta(microseconds=1))
    assert copy != IDS.derived("TIMER_COMMANDS", 2, stored)
    assert copy != IDS.derived("TIMER_DLQ", 1, stored)
    # The kinds never meet, whatever a tenant names its timers.
    assert IDS.event(f"TIMER_COMMANDS:1:{stored.isoformat()}") != copy


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        MessageIds(b"short")
