"""The DueTimeReached event body: valid JSON with exactly the fields docs/CONTRACT.md names, whatever
the ids."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

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


def _occurrence(tenant: str, key: str, due: datetime, **fields: Any) -> Claimed:
    recurring = (
        {"repeat_timezone": "Europe/Paris", "anchor_due_at": due}
        if fields.get("repeat_every") or fields.get("repeat_cron")
        else {}
    )
    base: dict[str, Any] = {
        "correlation_id": None,
        "lease_token": 7,
        "attempts": 1,
        "repeat_every": None,
        "repeat_times": None,
        "repeat_timezone": None,
        "anchor_due_at": None,
        "occurrence_index": 0,
        "recurrence_ref": due,
        "row_id": "(0,1)",
    }
    return Claimed(tenant, key, due, **{**base, **recurring, **fields})


DUE = datetime(2026, 11, 23, 9, 0, 0, 123456, tzinfo=UTC)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

# The exact bytes of events as the service published them before their code was made faster
# (issue 21, item 7): an event's JSON and its Nats-Msg-Id are what consumers and JetStream's
# duplicate window see, so any change to them, even one JSON-equal, is a change of the contract.
PINNED_EVENTS = [
    (
        _occurrence("acme", "plain-1", DUE),
        b'{"id":"acme:plain-1:1795424400123","type":"DueTimeReached","tenantId":"acme","correlationId":null,'
        b'"timestampMs":1795424401005,"payload":{"tenantId":"acme","serviceCallId":"plain-1",'
        b'"dueAt":"2026-11-23T09:00:00.123Z","reachedAt":"2026-11-23T09:00:01.005Z"}}',
        {"Nats-Msg-Id": "04aaf36332aeccf3b792c305c7303d30"},
    ),
    (
        _occurrence(
            "acme", "zero\u200bwidth é 日本 \U0001f600", DUE, correlation_id='tab\tnew\nline "x" ü\\'
        ),
        b'{"id":"acme:zero\\u200bwidth \\u00e9 \\u65e5\\u672c \\ud83d\\ude00:1795424400123",'
        b'"type":"DueTimeReached","tenantId":"acme","correlationId":"tab\\tnew\\nline \\"x\\" \\u00fc\\\\",'
        b'"timestampMs":1795424401005,"payload":{"tenantId":"acme",'
        b'"serviceCallId":"zero\\u200bwidth \\u00e9 \\u65e5\\u672c \\ud83d\\ude00",'
        b'"dueAt":"2026-11-23T09:00:00.123Z","reachedAt":"2026-11-23T09:00:01.005Z"}}',
        {"Nats-Msg-Id": "308d51be8ed11cc0c9219236cef4d520"},
    ),
    (  # half a millisecond, in another zone: the id rounds (half to even), dueAt truncates
        _occurrence(
            "acme",
            "d-1",
            datetime(2026, 11, 23, 10, 0, 0, 500, tzinfo=timezone(timedelta(hours=1))),
            correlation_id="",
            data='{"a": [1, "é", null], "b": {"c": true}}',
        ),
        b'{"id":"acme:d-1:1795424400000","type":"DueTimeReached","tenantId":"acme","correlationId":"",'
        b'"timestampMs":1795424401005,"payload":{"tenantId":"acme","serviceCallId":"d-1",'
        b'"dueAt":"2026-11-23T09:00:00.000Z","reachedAt":"2026-11-23T09:00:01.005Z"},'
        b'"data":{"a": [1, "\xc3\xa9", null], "b": {"c": true}}}',
        {"Nats-Msg-Id": "3f530846ce134c99a59117aa9f978346"},
    ),
    (
        _occurrence("t9", "carried", DUE, carried={"traceparent": TRACEPARENT, "X-Acme": "v"}),
        b'{"id":"t9:carried:1795424400123","type":"DueTimeReached","tenantId":"t9","correlationId":null,'
        b'"timestampMs":1795424401005,"payload":{"tenantId":"t9","serviceCallId":"carried",'
        b'"dueAt":"2026-11-23T09:00:00.123Z","reachedAt":"2026-11-23T09:00:01.005Z"}}',
        {"traceparent": TRACEPARENT, "X-Acme": "v", "Nats-Msg-Id": "e3e7d8efbbbc03c0a0ca8944a00c09ef"},
    ),
    (  # recurring, before the epoch
        _occurrence(
            "acme",
            "every",
            datetime(1960, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
            correlation_id="c1",
            repeat_every="PT1M",
            repeat_times=10,
            occurrence_index=3,
            data='"text"',
        ),
        b'{"id":"acme:every:-315521754321","type":"DueTimeReached","tenantId":"acme","correlationId":"c1",'
        b'"timestampMs":1795424401005,"payload":{"tenantId":"acme","serviceCallId":"every",'
        b'"dueAt":"1960-01-02T03:04:05.678Z","reachedAt":"2026-11-23T09:00:01.005Z"},"data":"text"}',
        {"Nats-Msg-Id": "61898233f3abf4dc50d18e2e73c538c8"},
    ),
    (
        _occurrence(
            "acme",
            "cron",
            datetime(2026, 3, 29, 1, 30, tzinfo=UTC),
            repeat_cron="0 9 * * MON-FRI",
            repeat_until=datetime(2027, 1, 1, tzinfo=UTC),
            occurrence_index=12,
            data="[]",
        ),
        b'{"id":"acme:cron:1774747800000","type":"DueTimeReached","tenantId":"acme","correlationId":null,'
        b'"timestampMs":1795424401005,"payload":{"tenantId":"acme","serviceCallId":"cron",'
        b'"dueAt":"2026-03-29T01:30:00.000Z","reachedAt":"2026-11-23T09:00:01.005Z"},"data":[]}',
        {"Nats-Msg-Id": "630555b73626b81c726f0239d83fe569"},
    ),
]


@pytest.mark.parametrize(("timer", "payload", "headers"), PINNED_EVENTS)
def test_an_event_s_bytes_and_nats_msg_id_stay_exactly_as_published(
    timer: Claimed, payload: bytes, headers: dict[str, str]
) -> None:
    reached = datetime(2026, 11, 23, 9, 0, 1, 5000, tzinfo=UTC)
    out = due_event(timer, f"svc.{timer.tenant_id}.timer.due", iso(reached), 1795424401005, IDS)
    assert (out.subject, out.payload, out.headers) == (f"svc.{timer.tenant_id}.timer.due", payload, headers)
    assert list(out.headers) == list(headers)  # Nats-Msg-Id last, after the carried headers


@pytest.mark.parametrize(
    ("due", "expected"),
    [
        (datetime(2026, 11, 23, 9, 0, 0, 999600, tzinfo=UTC), "a:b:1795424401000"),  # rounds up
        (datetime(2026, 11, 23, 9, 0, 0, 1500, tzinfo=UTC), "a:b:1795424400002"),  # half: to even
        (datetime(2026, 11, 23, 9, 0, 0, 2500, tzinfo=UTC), "a:b:1795424400002"),
        (datetime(1969, 12, 31, 23, 59, 59, 999500, tzinfo=UTC), "a:b:0"),
        (datetime(1, 1, 1, tzinfo=UTC), "a:b:-62135596800000"),
        (datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), "a:b:253402300800000"),
        (datetime(2026, 11, 23, 10, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1))), "a:b:1795424400123"),
    ],
)
def test_a_firing_id_is_the_due_time_in_milliseconds_rounded_as_before(due: datetime, expected: str) -> None:
    assert firing_id("a", "b", due) == expected


@pytest.mark.parametrize("length", [16, 32, 63, 64, 65, 200])  # around SHA-256's 64-byte block
def test_message_ids_are_hmac_sha256_of_what_they_name_whatever_the_secret_s_length(length: int) -> None:
    secret = bytes((7 + i) % 256 for i in range(length))
    ids = MessageIds(secret)
    for text in ("acme:sc-1:1795424400123", "zero\u200bwidth é 日本 \U0001f600:0", ""):
        expected = hmac.new(secret, f"due\0{text}".encode(), hashlib.sha256).hexdigest()[:32]
        assert ids.event(text) == expected
    stored = datetime(2026, 11, 23, 9, 0, 0, 123456, tzinfo=UTC)
    text = f"from\0TIMER_COMMANDS\0{1}\0{stored.isoformat()}"
    assert (
        ids.derived("TIMER_COMMANDS", 1, stored)
        == hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()[:32]
    )


def test_an_event_of_a_window_says_its_due_at_and_when_it_was_planned_to_fire() -> None:
    due = datetime(2026, 11, 23, 9, 0, 0, 123000, tzinfo=UTC)
    planned = due + timedelta(minutes=7, milliseconds=456)
    timer = _occurrence("acme", "bday", planned, nominal_due_at=due, fire_window="PT10M")
    out = due_event(timer, "svc.acme.timer.due", "2026-11-23T09:07:23.580Z", 1795425043580, IDS)
    body = json.loads(out.payload)
    # The id and Nats-Msg-Id are the occurrence's, by its dueAt: the same as without a window.
    assert body["id"] == firing_id("acme", "bday", due) and out.headers == {
        "Nats-Msg-Id": IDS.event(body["id"])
    }
    assert body["payload"] == {
        "tenantId": "acme",
        "serviceCallId": "bday",
        "dueAt": "2026-11-23T09:00:00.123Z",
        "plannedAt": "2026-11-23T09:07:00.579Z",
        "reachedAt": "2026-11-23T09:07:23.580Z",
    }


@pytest.mark.parametrize("window_ms", [1, 600_000, 86_400_000])
def test_a_window_s_spread_is_hmac_sha256_of_the_occurrence_as_before(window_ms: int) -> None:
    # Pinned: a replica of the next release re-claiming an occurrence plans the same instant.
    due = datetime(2026, 11, 23, 9, 0, 0, 123456, tzinfo=UTC)
    text = "window\0acme\0bday\x001795424400123"
    digest = hmac.new(b"a fleet secret of thirty-two b..", text.encode(), hashlib.sha256).hexdigest()[:32]
    assert IDS.spread("acme", "bday", due, window_ms) == int(digest, 16) % (window_ms + 1)
    assert IDS.spread("acme", "bday", due, 0) == 0
