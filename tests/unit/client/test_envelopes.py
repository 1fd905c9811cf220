"""The bulk path's commands (schedule_many, cancel_many): the envelope `schedule` sends, built per
call; the sending itself is tested against a real server in tests/integration/client/test_producer.py."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS

from worker.client import TimerClient
from worker.client.envelopes import Envelope, envelope, payload_json, uuid4s

DUE = datetime(2026, 11, 25, 9, 30, 0, 123456, tzinfo=UTC)


def client() -> TimerClient:
    return TimerClient(NATS(), "svc")  # never connected: building commands needs no server


def body(c: Envelope | str) -> dict[str, Any]:
    assert isinstance(c, Envelope), c
    decoded: dict[str, Any] = json.loads(c.body)
    return decoded


def test_ids_are_distinct_random_uuid4s_in_their_usual_text() -> None:
    ids = uuid4s(5000)
    assert len(set(ids)) == 5000
    for i in ids:
        u = uuid.UUID(i)
        assert (u.version, u.variant) == (4, uuid.RFC_4122)
        assert str(u) == i  # lower case, dashed: what str(uuid.uuid4()) gives
    # Every character that is not the version's is random: each takes several values.
    columns = [{i[k] for i in ids} for k in range(36)]
    fixed = {k for k, seen in enumerate(columns) if len(seen) == 1}
    assert fixed == {8, 13, 14, 18, 23}  # four dashes and the version digit
    assert columns[19] == set("89ab")  # the variant's two bits, and two random ones


def test_a_bulk_command_is_the_envelope_schedule_sends() -> None:
    timer = {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": DUE, "correlationId": "req-7", "data": [1]}
    (bulk,) = client()._commands("schedule", "ScheduleTimer", [timer])
    payload = {**timer, "dueAt": "2026-11-25T09:30:00.123Z"}
    one = envelope("svc.acme.timer.schedule", "ScheduleTimer", payload, "req-7")
    assert isinstance(bulk, Envelope)
    assert bulk.subject == one.subject
    got, want = body(bulk), body(one)
    assert got["id"] == bulk.id  # sent as Nats-Msg-Id too
    assert abs(got.pop("timestampMs") - want.pop("timestampMs")) < 60_000
    got.pop("id"), want.pop("id")
    assert got == want
    assert list(json.loads(bulk.body)) == list(json.loads(one.body))  # the same fields in the same order


@pytest.mark.parametrize(
    "timer",
    [
        {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": "2026-11-25T09:30:00+01:00"},
        {"tenantId": "acme", "serviceCallId": 'Zürich "1"', "dueAt": DUE, "correlationId": "ré-7"},
        {
            "tenantId": "a-b_c",
            "serviceCallId": "x",
            "dueAt": DUE,
            "correlationId": 7,
            "data": {"k": [1, None]},
        },
        {"tenantId": "acme", "serviceCallId": "r", "dueAt": DUE, "repeat": {"every": "P1D", "times": 3}},
    ],
)
def test_a_bulk_body_is_byte_for_byte_json_dumps_of_the_envelope(timer: dict[str, Any]) -> None:
    (bulk,) = client()._commands("schedule", "ScheduleTimer", [timer])
    assert isinstance(bulk, Envelope)
    payload = {
        **timer,
        "dueAt": timer["dueAt"] if isinstance(timer["dueAt"], str) else "2026-11-25T09:30:00.123Z",
    }
    correlation = timer.get("correlationId")
    envelope = {
        "id": bulk.id,
        "type": "ScheduleTimer",
        "tenantId": timer["tenantId"],
        "correlationId": correlation if isinstance(correlation, str) else None,
        "timestampMs": body(bulk)["timestampMs"],
        "payload": payload,
    }
    assert bulk.body == json.dumps(envelope).encode()


def test_one_call_shares_one_timestamp_and_leaves_the_callers_timers_as_they_were() -> None:
    timers = [{"tenantId": f"t{i % 3}", "serviceCallId": f"sc-{i}", "dueAt": DUE} for i in range(2500)]
    commands = client()._commands("schedule", "ScheduleTimer", timers)
    assert len({body(c)["timestampMs"] for c in commands}) == 1
    assert [body(c)["payload"]["serviceCallId"] for c in commands] == [f"sc-{i}" for i in range(2500)]
    assert {c.subject for c in commands if isinstance(c, Envelope)} == {
        f"svc.t{i}.timer.schedule" for i in range(3)
    }
    assert all(t["dueAt"] is DUE for t in timers)


def test_a_bad_tenant_is_an_error_in_its_place_and_the_rest_are_built() -> None:
    timers: list[dict[str, Any]] = [
        {"tenantId": "acme", "serviceCallId": "a"},
        {"tenantId": "no.dots", "serviceCallId": "b"},
        {"tenantId": ["acme"], "serviceCallId": "c"},
        {"tenantId": "acme", "serviceCallId": "e"},
    ]
    out = client()._commands("cancel", "CancelTimer", timers)
    assert [type(c).__name__ for c in out] == ["Envelope", "str", "str", "Envelope"]
    assert [body(out[i])["payload"]["serviceCallId"] for i in (0, 3)] == ["a", "e"]
    for bad in out[1:3]:
        assert isinstance(bad, str) and "tenantId must match" in bad


text = st.text(alphabet=st.characters(codec=None, exclude_categories=()))  # any code point, surrogates too
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


@given(st.dictionaries(text, text | json_values, max_size=6))
@settings(max_examples=300)
def test_a_payload_is_encoded_byte_for_byte_as_json_dumps_does(payload: dict[str, Any]) -> None:
    # Text-only payloads take the string encoder's path, the others json.dumps: both must match it.
    assert payload_json(payload) == json.dumps(payload)
    assert payload_json(MappingProxyType(payload)) == json.dumps(payload)  # any Mapping, as dict(t) took


def test_a_payload_json_dumps_refuses_raises_before_anything_is_built() -> None:
    timers = [{"tenantId": "acme", "serviceCallId": "a", "dueAt": DUE, "data": object()}]
    with pytest.raises(TypeError, match="not JSON serializable"):
        client()._commands("schedule", "ScheduleTimer", timers)


def test_each_command_keeps_its_own_due_time_when_a_call_mixes_several() -> None:
    other = datetime(2027, 1, 2, 3, 4, 5, 6000, tzinfo=UTC)
    dues = [DUE, DUE, other, DUE, "2026-11-25T09:30:00Z", other]
    timers = [{"tenantId": "acme", "serviceCallId": f"sc-{i}", "dueAt": d} for i, d in enumerate(dues)]
    commands = client()._commands("schedule", "ScheduleTimer", timers)
    want = ["2026-11-25T09:30:00.123Z"] * 2 + ["2027-01-02T03:04:05.006Z", "2026-11-25T09:30:00.123Z"]
    assert [body(c)["payload"]["dueAt"] for c in commands] == [*want, dues[4], "2027-01-02T03:04:05.006Z"]
