"""The validation boundary (docs/CONTRACT.md, Reason codes): each bad input has its reason, and no
input makes it raise."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from worker.contract import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    INVALID_TENANT,
    MAX_BODY_BYTES,
    REASONS,
    CancelTimer,
    Command,
    Rejection,
    Repeat,
    ScheduleTimer,
    is_valid_tenant,
)
from worker.core.commands import parse_command

NOW = datetime(2026, 1, 1, tzinfo=UTC)
HORIZON = timedelta(days=3650)
FLAT = {
    "tenantId": "acme",
    "serviceCallId": "sc-42",
    "dueAt": "2026-11-22T09:00:00Z",
    "correlationId": "req-7",
}


def parse(body: bytes | dict[str, Any], kind: str = "schedule", tenant: str = "acme") -> Command | Rejection:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    return parse_command(kind, tenant, raw, now=NOW, max_horizon=HORIZON)  # type: ignore[arg-type]


def schedule(**changes: Any) -> dict[str, Any]:
    """The flat ScheduleTimer with fields changed; a value of ... drops the field."""
    body = {**FLAT, **changes}
    return {k: v for k, v in body.items() if v is not ...}


def envelope(payload: dict[str, Any], type_: str = "ScheduleTimer", **outer: Any) -> dict[str, Any]:
    body = {
        "id": "e-1",
        "type": type_,
        "tenantId": "acme",
        "correlationId": None,
        "timestampMs": 1763800000000,
    }
    return {**body, **outer, "payload": payload}


def reason(result: Command | Rejection) -> str:
    assert isinstance(result, Rejection), f"accepted: {result}"
    assert_detail_is_safe(result)
    return result.reason


def assert_detail_is_safe(rejection: Rejection) -> None:
    assert rejection.reason in REASONS
    assert rejection.detail.isascii() and rejection.detail.isprintable()
    assert len(rejection.detail) <= 200


# --- accepted forms ---------------------------------------------------------------------------


def test_flat_schedule() -> None:
    assert parse(FLAT) == ScheduleTimer(
        "acme", "sc-42", datetime(2026, 11, 22, 9, tzinfo=UTC), "req-7", None, None
    )


def test_envelope_schedule_takes_timestamp_and_correlation_from_the_envelope() -> None:
    body = envelope(schedule(correlationId=...), correlationId="env-corr")
    assert parse(body) == ScheduleTimer(
        "acme", "sc-42", datetime(2026, 11, 22, 9, tzinfo=UTC), "env-corr", 1763800000000, None
    )


def test_envelope_as_the_client_sends_it() -> None:
    """The client puts correlationId null on the envelope and in no payload."""
    result = parse(envelope(schedule(correlationId=...)))
    assert isinstance(result, ScheduleTimer) and result.correlation_id is None


def test_cancel_flat_and_envelope() -> None:
    body = {"tenantId": "acme", "serviceCallId": "sc-42"}
    assert parse(body, "cancel") == CancelTimer("acme", "sc-42", None, None)
    assert parse(envelope(body, "CancelTimer"), "cancel") == CancelTimer("acme", "sc-42", None, 1763800000000)


def test_flat_timestamp_ms_is_read_too() -> None:
    result = parse(schedule(timestampMs=7))
    assert isinstance(result, ScheduleTimer) and result.timestamp_ms == 7


def test_unknown_keys_are_ignored() -> None:
    assert isinstance(parse(schedule(future={"x": [1, 2]})), ScheduleTimer)
    assert isinstance(parse(envelope(FLAT, source="svc-a")), ScheduleTimer)


@pytest.mark.parametrize(
    ("due_at", "expected"),
    [
        ("2026-11-22T09:00:00Z", datetime(2026, 11, 22, 9, tzinfo=UTC)),
        ("2026-11-22t09:00:00z", datetime(2026, 11, 22, 9, tzinfo=UTC)),
        ("2026-11-22 09:00:00+02:00", datetime(2026, 11, 22, 7, tzinfo=UTC)),
        ("2026-11-22T09:00:00.5-05:30", datetime(2026, 11, 22, 14, 30, 0, 500000, tzinfo=UTC)),
        ("2026-11-22T09:00:00.123456789Z", datetime(2026, 11, 22, 9, 0, 0, 123456, tzinfo=UTC)),
        ("2026-11-22T09:00:00-00:00", datetime(2026, 11, 22, 9, tzinfo=UTC)),
        ("2001-01-01T00:00:00Z", datetime(2001, 1, 1, tzinfo=UTC)),  # the past fires at once
        # The start of the range every layer holds (README, dueAt), whatever the offset.
        ("1970-01-01T00:00:00Z", datetime(1970, 1, 1, tzinfo=UTC)),
        ("1969-12-31T19:00:00-05:00", datetime(1970, 1, 1, tzinfo=UTC)),
    ],
)
def test_due_at_forms(due_at: str, expected: datetime) -> None:
    result = parse(schedule(dueAt=due_at))
    assert isinstance(result, ScheduleTimer)
    assert result.due_at == expected and result.due_at.utcoffset() == timedelta(0)


@pytest.mark.parametrize(
    "service_call_id", ["a\u200bb", "\u200d", "Grüße-42", "注文-7", "😀" * 200, "x" * 200]
)
def test_zero_width_and_non_ascii_ids_are_accepted(service_call_id: str) -> None:
    for ensure_ascii in (True, False):
        raw = json.dumps(schedule(serviceCallId=service_call_id), ensure_ascii=ensure_ascii).encode()
        result = parse(raw)
        assert isinstance(result, ScheduleTimer) and result.service_call_id == service_call_id


def test_escaped_surrogate_pair_is_one_character() -> None:
    result = parse(b'{"tenantId":"acme","serviceCallId":"\\ud83d\\ude00","dueAt":"2026-11-22T09:00:00Z"}')
    assert isinstance(result, ScheduleTimer) and result.service_call_id == "\U0001f600"


@pytest.mark.parametrize(
    ("repeat", "expected"),
    [
        ({"every": "PT1H"}, Repeat("PT1H", None, None)),
        ({"every": "P1D", "times": 3, "timezone": "Europe/Berlin"}, Repeat("P1D", 3, "Europe/Berlin")),
        ({"every": "P1M", "times": None, "timezone": None}, Repeat("P1M", None, None)),
        (
            {"every": "P1Y", "timezone": "America/Argentina/ComodRivadavia"},
            Repeat("P1Y", None, "America/Argentina/ComodRivadavia"),
        ),
        ({"every": "P1W", "timezone": "UTC"}, Repeat("P1W", None, "UTC")),
        ({"every": "PT1S"}, Repeat("PT1S", None, None)),
        ({"every": "P1Y2M3DT4H5M6S", "times": 1}, Repeat("P1Y2M3DT4H5M6S", 1, None)),
    ],
)
def test_repeat_accepted(repeat: dict[str, Any], expected: Repeat) -> None:
    result = parse(schedule(repeat=repeat))
    assert isinstance(result, ScheduleTimer) and result.repeat == expected


def test_repeat_null_is_no_repeat_and_cancel_ignores_it() -> None:
    result = parse(schedule(repeat=None))
    assert isinstance(result, ScheduleTimer) and result.repeat is None
    body = {"tenantId": "acme", "serviceCallId": "sc", "repeat": {"every": "nonsense"}}
    assert isinstance(parse(body, "cancel"), CancelTimer)


# --- rejections, one reason each -------------------------------------------------------------

BAD: list[tuple[str, bytes | dict[str, Any], str]] = [
    ("not json", b"{tenantId: acme}", "invalid_json"),
    ("empty body", b"", "invalid_json"),
    ("trailing garbage", json.dumps(FLAT).encode() + b"x", "invalid_json"),
    ("utf-8 bom", b"\xef\xbb\xbf" + json.dumps(FLAT).encode(), "invalid_json"),
    ("deep nesting", b"[" * 30_000 + b"]" * 30_000, "invalid_json"),
    ("huge integer", b'{"x": ' + b"9" * 5000 + b"}", "invalid_json"),
    ("raw invalid utf-8", b'{"tenantId": "acme\xff"}', "invalid_utf8"),
    ("utf-8 encoded surrogate", b'{"tenantId": "\xed\xa0\x80"}', "invalid_utf8"),
    ("truncated utf-8", b'{"x": "\xe6\x97"}', "invalid_utf8"),
    ("top level array", b"[]", "wrong_type"),
    ("top level string", b'"\\ud800"', "wrong_type"),
    ("top level null", b"null", "wrong_type"),
    ("NaN", b'{"x": NaN}', "non_finite_number"),
    ("Infinity", b'{"tenantId": "acme", "x": [Infinity]}', "non_finite_number"),
    ("-Infinity", b'{"x": {"y": -Infinity}}', "non_finite_number"),
    ("float overflow", b'{"x": 1e999}', "non_finite_number"),
    ("duplicate key", b'{"tenantId": "acme", "tenantId": "acme"}', "duplicate_key"),
    ("nested duplicate", b'{"payload": {"a": 1, "b": {"c": 1, "c": 2}}}', "duplicate_key"),
    ("escaped duplicate", b'{"tenantId": "acme", "\\u0074enantId": "evil"}', "duplicate_key"),
    ("missing tenant", schedule(tenantId=...), "missing_field"),
    ("null tenant", schedule(tenantId=None), "missing_field"),
    ("missing id", schedule(serviceCallId=...), "missing_field"),
    ("missing dueAt", schedule(dueAt=...), "missing_field"),
    ("tenant not a string", schedule(tenantId=7), "wrong_type"),
    ("id not a string", schedule(serviceCallId=42), "wrong_type"),
    ("dueAt a number", schedule(dueAt=1763800000000), "wrong_type"),
    ("correlation a list", schedule(correlationId=["x"]), "wrong_type"),
    ("timestamp a float", schedule(timestampMs=1.5), "wrong_type"),
    ("timestamp a whole float", schedule(timestampMs=1763800000000.0), "wrong_type"),
    ("timestamp a bool", schedule(timestampMs=True), "wrong_type"),
    ("timestamp a string", schedule(timestampMs="1"), "wrong_type"),
    ("negative timestamp", schedule(timestampMs=-1), "bad_timestamp"),
    ("timestamp past bigint", schedule(timestampMs=2**63), "bad_timestamp"),
    ("bad tenant", schedule(tenantId="ac.me"), "bad_tenant"),
    ("empty tenant", schedule(tenantId=""), "bad_tenant"),
    ("tenant with newline", schedule(tenantId="acme\n"), "bad_tenant"),
    ("tenant too long", schedule(tenantId="a" * 65), "bad_tenant"),
    ("tenant not the subject's", schedule(tenantId="other"), "tenant_mismatch"),
    ("envelope tenant not the payload's", envelope(FLAT, tenantId="other"), "tenant_mismatch"),
    ("envelope tenant not a string", envelope(FLAT, tenantId=1), "wrong_type"),
    ("empty id", schedule(serviceCallId=""), "bad_service_call_id"),
    ("id too long", schedule(serviceCallId="x" * 201), "bad_service_call_id"),
    ("id with NUL", schedule(serviceCallId="a\x00b"), "bad_service_call_id"),
    ("id with newline", schedule(serviceCallId="a\nb"), "bad_service_call_id"),
    ("id with DEL", schedule(serviceCallId="a\x7f"), "bad_service_call_id"),
    ("id with C1 control", schedule(serviceCallId="a\x85"), "bad_service_call_id"),
    (
        "id a lone surrogate",
        b'{"tenantId":"acme","serviceCallId":"\\ud800","dueAt":"2026-11-22T09:00:00Z"}',
        "bad_service_call_id",
    ),
    (
        "id a low surrogate",
        b'{"tenantId":"acme","serviceCallId":"a\\udc00","dueAt":"2026-11-22T09:00:00Z"}',
        "bad_service_call_id",
    ),
    ("correlation with NUL", schedule(correlationId="\x00"), "bad_correlation_id"),
    ("correlation too long", schedule(correlationId="c" * 201), "bad_correlation_id"),
    ("correlation empty", schedule(correlationId=""), "bad_correlation_id"),
    ("dueAt without offset", schedule(dueAt="2026-11-22T09:00:00"), "bad_due_at"),
    ("dueAt date only", schedule(dueAt="2026-11-22"), "bad_due_at"),
    ("dueAt basic format", schedule(dueAt="20261122T090000Z"), "bad_due_at"),
    ("dueAt without seconds", schedule(dueAt="2026-11-22T09:00Z"), "bad_due_at"),
    ("dueAt offset without colon", schedule(dueAt="2026-11-22T09:00:00+0200"), "bad_due_at"),
    ("dueAt epoch string", schedule(dueAt="1763800000"), "bad_due_at"),
    ("dueAt empty fraction", schedule(dueAt="2026-11-22T09:00:00.Z"), "bad_due_at"),
    ("dueAt Feb 30", schedule(dueAt="2026-02-30T09:00:00Z"), "bad_due_at"),
    ("dueAt hour 24", schedule(dueAt="2026-11-22T24:00:00Z"), "bad_due_at"),
    ("dueAt leap second", schedule(dueAt="2016-12-31T23:59:60Z"), "bad_due_at"),
    ("dueAt offset 24h", schedule(dueAt="2026-11-22T09:00:00+24:00"), "bad_due_at"),
    ("dueAt offset minutes 60", schedule(dueAt="2026-11-22T09:00:00+01:60"), "bad_due_at"),
    ("dueAt year 0", schedule(dueAt="0000-01-01T00:00:00Z"), "bad_due_at"),
    ("dueAt year 1 east of UTC", schedule(dueAt="0001-01-01T00:00:00+01:00"), "bad_due_at"),
    ("dueAt year 9999 west of UTC", schedule(dueAt="9999-12-31T23:30:00-01:00"), "bad_due_at"),
    ("dueAt unicode digits", schedule(dueAt="٢٠٢٦-11-22T09:00:00Z"), "bad_due_at"),
    ("dueAt year 1 far east", schedule(dueAt="0001-01-01T00:00:00+23:59"), "bad_due_at"),
    ("dueAt year 9999 far west", schedule(dueAt="9999-12-31T23:59:59.999999-23:59"), "bad_due_at"),
    ("dueAt with NUL", schedule(dueAt="2026-11-22T09:00:00\x00Z"), "bad_due_at"),
    ("dueAt a lone surrogate", b'{"tenantId":"acme","serviceCallId":"x","dueAt":"\\ud800"}', "bad_due_at"),
    ("tenant a lone surrogate", b'{"tenantId":"\\udc00","serviceCallId":"x"}', "bad_tenant"),
    ("tenant with zero-width space", schedule(tenantId="acme\u200b"), "bad_tenant"),
    ("tenant non-ASCII", schedule(tenantId="acmé"), "bad_tenant"),
    ("tenant with NUL", schedule(tenantId="acme\x00"), "bad_tenant"),
    ("type a lone surrogate", b'{"type":"\\ud800","payload":{}}', "unknown_type"),
    ("dueAt trailing newline", schedule(dueAt="2026-11-22T09:00:00Z\n"), "bad_due_at"),
    ("dueAt beyond horizon", schedule(dueAt="2036-01-01T00:00:01Z"), "beyond_horizon"),
    ("dueAt year 9999", schedule(dueAt="9999-12-31T23:59:59Z"), "bad_due_at"),
    # Outside the range: west of UTC, year 1 was no Python datetime (it stopped every replica).
    ("dueAt year 1", schedule(dueAt="0001-01-01T00:00:00Z"), "bad_due_at"),
    ("dueAt year 1 west of UTC", schedule(dueAt="0001-01-01T00:00:00-01:00"), "bad_due_at"),
    ("dueAt before 1970", schedule(dueAt="1969-12-31T23:59:59.999Z"), "bad_due_at"),
    ("dueAt after the range", schedule(dueAt="9999-12-31T00:00:00.000001Z"), "bad_due_at"),
    ("dueAt beyond horizon, in range", schedule(dueAt="9999-12-30T00:00:00Z"), "beyond_horizon"),
    ("unknown type", envelope(FLAT, "DueTimeReached"), "unknown_type"),
    ("type not a string", envelope(FLAT, 5), "wrong_type"),  # type: ignore[arg-type]
    ("cancel type on schedule", envelope(FLAT, "CancelTimer"), "type_mismatch"),
    ("type without payload", {"type": "ScheduleTimer", **FLAT}, "missing_field"),
    ("payload without type", {"payload": FLAT}, "missing_field"),
    ("payload not an object", {"type": "ScheduleTimer", "payload": [FLAT]}, "wrong_type"),
    ("repeat not an object", schedule(repeat="PT1H"), "bad_repeat"),
    ("repeat without every", schedule(repeat={"times": 2}), "bad_repeat"),
    ("repeat every not a string", schedule(repeat={"every": 3600}), "bad_repeat"),
    ("repeat every not a duration", schedule(repeat={"every": "1 hour"}), "bad_repeat"),
    ("repeat every zero", schedule(repeat={"every": "PT0S"}), "bad_repeat"),
    ("repeat every P0D", schedule(repeat={"every": "P0D"}), "bad_repeat"),
    ("repeat every empty", schedule(repeat={"every": "PT"}), "bad_repeat"),
    ("repeat every negative", schedule(repeat={"every": "-P1D"}), "bad_repeat"),
    ("repeat every sub-second", schedule(repeat={"every": "PT0.5S"}), "bad_repeat"),
    ("repeat every fractional month", schedule(repeat={"every": "P1.5M"}), "bad_repeat"),
    ("repeat every huge", schedule(repeat={"every": "P99999999999D"}), "bad_repeat"),
    ("repeat every lowercase", schedule(repeat={"every": "pt1h"}), "bad_repeat"),
    ("repeat times zero", schedule(repeat={"every": "PT1H", "times": 0}), "bad_repeat"),
    ("repeat times bool", schedule(repeat={"every": "PT1H", "times": True}), "bad_repeat"),
    ("repeat times float", schedule(repeat={"every": "PT1H", "times": 2.0}), "bad_repeat"),
    ("repeat times past int4", schedule(repeat={"every": "PT1H", "times": 2**31}), "bad_repeat"),
    ("repeat unknown key", schedule(repeat={"every": "PT1H", "time": 3}), "bad_repeat"),
    ("window not a string", schedule(window=600), "bad_window"),
    ("window not a duration", schedule(window="10 minutes"), "bad_window"),
    ("window empty", schedule(window="PT"), "bad_window"),
    ("window P", schedule(window="P"), "bad_window"),
    ("window over a day", schedule(window="PT24H0.001S"), "bad_window"),
    ("window two days", schedule(window="P2D"), "bad_window"),
    ("window in weeks", schedule(window="P1W"), "bad_window"),
    ("window in months", schedule(window="P1M"), "bad_window"),
    ("window negative", schedule(window="-PT1M"), "bad_window"),
    ("window below a millisecond", schedule(window="PT0.0001S"), "bad_window"),
    ("window huge", schedule(window="PT99999999999S"), "bad_window"),
    ("window lowercase", schedule(window="pt10m"), "bad_window"),
    ("window trailing newline", schedule(window="PT10M\n"), "bad_window"),
    ("expireAfter not a string", schedule(expireAfter=3600), "bad_expire_after"),
    ("repeat catchup unknown", schedule(repeat={"every": "PT1H", "catchup": "some"}), "bad_repeat"),
    ("repeat catchup not a string", schedule(repeat={"every": "PT1H", "catchup": ["all"]}), "bad_repeat"),
    ("expireAfter zero", schedule(expireAfter="PT0S"), "bad_expire_after"),
    ("expireAfter over a week", schedule(expireAfter="P8D"), "bad_expire_after"),
    ("expireAfter in months", schedule(expireAfter="P1M"), "bad_expire_after"),
    ("repeat timezone not a string", schedule(repeat={"every": "P1D", "timezone": 1}), "bad_repeat"),
    ("unknown timezone", schedule(repeat={"every": "P1D", "timezone": "Mars/Olympus"}), "unknown_timezone"),
    (
        "timezone path trick",
        schedule(repeat={"every": "P1D", "timezone": "../../etc/passwd"}),
        "unknown_timezone",
    ),
    (
        "timezone absolute path",
        schedule(repeat={"every": "P1D", "timezone": "/etc/localtime"}),
        "unknown_timezone",
    ),
    (
        "timezone dot segment",
        schedule(repeat={"every": "P1D", "timezone": "Europe/./Berlin"}),
        "unknown_timezone",
    ),
    ("timezone a directory", schedule(repeat={"every": "P1D", "timezone": "Europe"}), "unknown_timezone"),
    ("timezone a data file", schedule(repeat={"every": "P1D", "timezone": "zone.tab"}), "unknown_timezone"),
    (
        "timezone of the machine",
        schedule(repeat={"every": "P1D", "timezone": "localtime"}),
        "unknown_timezone",
    ),
    (
        "timezone wrong case",
        schedule(repeat={"every": "P1D", "timezone": "europe/berlin"}),
        "unknown_timezone",
    ),
    ("timezone with NUL", schedule(repeat={"every": "P1D", "timezone": "UTC\x00"}), "unknown_timezone"),
    (
        "timezone a lone surrogate",
        b'{"tenantId":"acme","serviceCallId":"x","dueAt":"2026-11-22T09:00:00Z",'
        b'"repeat":{"every":"P1D","timezone":"\\ud800"}}',
        "unknown_timezone",
    ),
    (
        "every a lone surrogate",
        b'{"tenantId":"acme","serviceCallId":"x","dueAt":"2026-11-22T09:00:00Z","repeat":{"every":"\\ud800"}}',
        "bad_repeat",
    ),
]


@pytest.mark.parametrize(("body", "expected"), [(b, r) for _, b, r in BAD], ids=[n for n, _, _ in BAD])
def test_rejected_with_reason(body: bytes | dict[str, Any], expected: str) -> None:
    result = parse(body)
    assert reason(result) == expected
    assert isinstance(result, Rejection) and result.tenant_token == "acme"


def test_the_same_rejections_inside_an_envelope() -> None:
    for name, body, expected in BAD:
        if isinstance(body, dict) and "payload" not in body and "type" not in body:
            assert reason(parse(envelope(body))) == expected, name


def test_schedule_type_on_cancel_subject() -> None:
    assert reason(parse(envelope(FLAT), "cancel")) == "type_mismatch"


def test_cancel_checks_its_fields() -> None:
    assert reason(parse({"tenantId": "acme"}, "cancel")) == "missing_field"
    assert reason(parse({"tenantId": "acme", "serviceCallId": "a\x00"}, "cancel")) == "bad_service_call_id"
    assert reason(parse({"tenantId": "other", "serviceCallId": "x"}, "cancel")) == "tenant_mismatch"


@pytest.mark.parametrize("subject_tenant", ["", "a.b", "a*", ">", "x" * 65, "acme\n", "ac me", "émile"])
def test_invalid_subject_tenant_goes_to_the_invalid_token(subject_tenant: str) -> None:
    result = parse(schedule(tenantId=subject_tenant), tenant=subject_tenant)
    assert reason(result) == "bad_tenant"
    assert isinstance(result, Rejection) and result.tenant_token == INVALID_TENANT


def test_tenant_in_body_is_not_the_subject_tenant() -> None:
    result = parse(schedule(tenantId="victim"), tenant="attacker")
    assert reason(result) == "tenant_mismatch"
    assert isinstance(result, Rejection) and result.tenant_token == "attacker"


def test_body_size_limit() -> None:
    padded = json.dumps(schedule(pad="")).encode()
    fits = padded.replace(b'"pad": ""', b'"pad": "' + b"x" * (MAX_BODY_BYTES - len(padded)) + b'"')
    assert len(fits) == MAX_BODY_BYTES and isinstance(parse(fits), ScheduleTimer)
    assert reason(parse(fits[:-1] + b" }")) == "body_too_large"


def test_the_last_instant_of_the_range_is_accepted_when_the_horizon_allows() -> None:
    raw = json.dumps(schedule(dueAt="9999-12-31T01:00:00+01:00")).encode()
    result = parse_command("schedule", "acme", raw, now=NOW, max_horizon=timedelta(days=3_000_000))
    assert isinstance(result, ScheduleTimer) and result.due_at == datetime(9999, 12, 31, tzinfo=UTC)
    later = json.dumps(schedule(dueAt="9999-12-31T23:30:00+01:00")).encode()
    rejected = parse_command("schedule", "acme", later, now=NOW, max_horizon=timedelta(days=3_000_000))
    assert isinstance(rejected, Rejection) and rejected.reason == "bad_due_at"
    assert "1970-01-01T00:00:00Z..9999-12-31T00:00:00Z" in rejected.detail


def test_nul_and_surrogates_in_ignored_keys_do_not_matter() -> None:
    body = b'{"tenantId":"acme","serviceCallId":"x","dueAt":"2026-11-22T09:00:00Z","\\ud800":"\\u0000"}'
    assert isinstance(parse(body), ScheduleTimer)


def test_ten_megabytes_are_rejected_by_size_before_decoding() -> None:
    huge = b"\xff" * (10 * 1024 * 1024)  # invalid UTF-8 and JSON too: size must win
    started = time.perf_counter()
    result = parse(huge)
    assert reason(result) == "body_too_large"
    assert time.perf_counter() - started < 0.05


def test_is_valid_tenant() -> None:
    assert is_valid_tenant("acme") and is_valid_tenant("A_b-9" * 12 + "abcd")
    assert not is_valid_tenant("acme\n") and not is_valid_tenant("a" * 65) and not is_valid_tenant("")


# --- properties --------------------------------------------------------------------------------

FAST = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
subject_tenants = st.sampled_from(["acme", "other", "_invalid", "a.b", ""]) | st.text(max_size=70)


def check_total(kind: str, tenant: str, body: bytes) -> Command | Rejection:
    result = parse_command(kind, tenant, body, now=NOW, max_horizon=HORIZON)  # type: ignore[arg-type]
    assert isinstance(result, ScheduleTimer | CancelTimer | Rejection)
    if isinstance(result, Rejection):
        assert_detail_is_safe(result)
        assert result.tenant_token == (tenant if is_valid_tenant(tenant) else INVALID_TENANT)
    else:
        assert result.tenant_id == tenant
        assert isinstance(result, ScheduleTimer) == (kind == "schedule")
    return result


@FAST
@given(st.sampled_from(["schedule", "cancel"]), subject_tenants, st.binary(max_size=300))
def test_any_bytes(kind: str, tenant: str, body: bytes) -> None:
    check_total(kind, tenant, body)


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[str, bytes]:
    """A valid command, then fields dropped, replaced by random JSON, or added, at any level."""
    kind = draw(st.sampled_from(["schedule", "cancel"]))
    flat: dict[str, Any] = dict(FLAT)
    if kind == "schedule" and draw(st.booleans()):
        flat["repeat"] = {"every": "P1D", "times": 3, "timezone": "Europe/Berlin"}
    body: dict[str, Any] = envelope(flat, COMMAND_TYPE[kind]) if draw(st.booleans()) else flat
    for _ in range(draw(st.integers(1, 4))):
        targets = [body, flat, flat.get("repeat"), body.get("payload")]
        target = draw(st.sampled_from([t for t in targets if isinstance(t, dict)]))
        key = draw(st.sampled_from([*target, "type", "payload", "every", "timezone", "times", "x"]))
        action = draw(st.sampled_from(["drop", "replace", "replace"]))
        if action == "drop":
            target.pop(key, None)
        else:
            target[key] = draw(json_values)
    raw = json.dumps(body, ensure_ascii=draw(st.booleans()))
    # Lone surrogates cannot be UTF-8 encoded: "surrogatepass" writes them as invalid bytes.
    return kind, raw.encode("utf-8", "surrogatepass")


COMMAND_TYPE = {"schedule": "ScheduleTimer", "cancel": "CancelTimer"}


@FAST
@given(near_valid())
def test_near_valid_json(case: tuple[str, bytes]) -> None:
    kind, body = case
    check_total(kind, "acme", body)


@FAST
@given(st.sampled_from(["schedule", "cancel"]), st.data())
def test_byte_mutations_of_a_valid_body(kind: str, data: st.DataObject) -> None:
    raw = bytearray(
        json.dumps(envelope(schedule(repeat={"every": "PT1H", "times": 2}), COMMAND_TYPE[kind])).encode()
    )
    for _ in range(data.draw(st.integers(1, 5))):
        at = data.draw(st.integers(0, len(raw)))
        if data.draw(st.booleans()):
            raw[at : at + data.draw(st.integers(0, 4))] = b""
        else:
            raw[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    check_total(kind, "acme", bytes(raw))


id_text = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=200)
tenants = st.from_regex(r"\A[A-Za-z0-9_-]{1,64}\Z")
offsets = st.integers(-23 * 60 - 59, 23 * 60 + 59)


@st.composite
def valid_schedules(draw: st.DrawFn) -> tuple[ScheduleTimer, bytes]:
    tenant = draw(tenants)
    due = draw(st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(2035, 12, 1))).replace(
        tzinfo=UTC
    )
    offset = draw(offsets)
    local = (due + timedelta(minutes=offset)).replace(tzinfo=None)
    sign = "-" if offset < 0 else "+"
    zone = (
        "Z" if offset == 0 and draw(st.booleans()) else f"{sign}{abs(offset) // 60:02}:{abs(offset) % 60:02}"
    )
    stamp = local.isoformat(sep=draw(st.sampled_from(["T", " "])), timespec="microseconds") + zone
    repeat = draw(
        st.none()
        | st.builds(
            Repeat,
            st.sampled_from(["PT1S", "PT1H", "P1D", "P1W", "P1M", "P1Y", "P1Y2M3DT4H5M6S"]),
            st.none() | st.integers(1, 2**31 - 1),
            st.none() | st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]),
        )
    )
    expected = ScheduleTimer(
        tenant,
        draw(id_text),
        due,
        draw(st.none() | id_text),
        draw(st.none() | st.integers(0, 2**63 - 1)),
        repeat,
    )
    payload: dict[str, Any] = {"tenantId": tenant, "serviceCallId": expected.service_call_id, "dueAt": stamp}
    if expected.correlation_id is not None:
        payload["correlationId"] = expected.correlation_id
    if repeat is not None:
        payload["repeat"] = {"every": repeat.every, "times": repeat.times, "timezone": repeat.timezone}
    if draw(st.booleans()):
        body = {
            "type": "ScheduleTimer",
            "tenantId": tenant,
            "timestampMs": expected.timestamp_ms,
            "payload": payload,
        }
    else:
        body = {**payload, "timestampMs": expected.timestamp_ms}
    return expected, json.dumps(body, ensure_ascii=draw(st.booleans())).encode()


@FAST
@given(valid_schedules())
def test_valid_commands_round_trip(case: tuple[ScheduleTimer, bytes]) -> None:
    expected, body = case
    assert parse_command("schedule", expected.tenant_id, body, now=NOW, max_horizon=HORIZON) == expected


@FAST
@given(tenants, id_text, st.none() | id_text)
def test_valid_cancels_round_trip(tenant: str, service_call_id: str, correlation_id: str | None) -> None:
    body = json.dumps({"tenantId": tenant, "serviceCallId": service_call_id, "correlationId": correlation_id})
    expected = CancelTimer(tenant, service_call_id, correlation_id, None)
    assert parse_command("cancel", tenant, body.encode(), now=NOW, max_horizon=HORIZON) == expected


# --- cron, until and data (issue 23) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("repeat", "names"),
    [
        ({"every": "P1D", "cron": "0 9 * * *"}, "exactly one of every"),
        ({"cron": "0 9 * *"}, "repeat.cron '0 9 * *'"),
        ({"cron": "0 25 * * *"}, "repeat.cron '0 25 * * *'"),
        ({"cron": ["0", "9"]}, "repeat.cron must be"),
        ({"cron": "0 9 * * *", "until": "tomorrow"}, "repeat.until 'tomorrow'"),
        ({"cron": "0 9 * * *", "until": 1}, "repeat.until must be"),
        ({"every": "P1D", "until": "2026-11-21T09:00:00Z"}, "repeat.until is before the first"),
        ({"cron": "0 10 * * *", "until": "2026-11-22T09:30:00Z"}, "repeat.until is before the first"),
    ],
)
def test_a_bad_cron_or_until_is_bad_repeat_naming_the_field(repeat: dict[str, Any], names: str) -> None:
    rejected = parse(schedule(repeat=repeat))
    assert isinstance(rejected, Rejection) and rejected.reason == "bad_repeat", rejected
    assert names in rejected.detail


def test_a_cron_timer_starts_at_the_first_match_at_or_after_due_at() -> None:
    # dueAt 2026-11-22T09:00Z is a Sunday, 10:00 in Paris.
    parsed = parse(schedule(repeat={"cron": "0 9 * * MON-FRI", "timezone": "Europe/Paris"}))
    assert isinstance(parsed, ScheduleTimer) and parsed.repeat is not None
    assert parsed.due_at == datetime(2026, 11, 23, 8, tzinfo=UTC)  # Monday 09:00 CET
    assert parsed.repeat.cron == "0 9 * * MON-FRI" and parsed.repeat.every is None
    exact = parse(schedule(repeat={"cron": "0 9 * * *"}))  # dueAt matches itself: it is the first
    assert isinstance(exact, ScheduleTimer) and exact.due_at == datetime(2026, 11, 22, 9, tzinfo=UTC)
    until = parse(schedule(repeat={"every": "PT1H", "until": "2026-11-22T10:00:00+01:00"}))
    assert isinstance(until, ScheduleTimer) and until.repeat is not None
    assert until.repeat.until == datetime(2026, 11, 22, 9, tzinfo=UTC)  # inclusive: dueAt itself


@pytest.mark.parametrize("data", [{"a": [1, 2.5, None, True]}, [1], "t", 0, False, {"\u00e9": "\U0001f600"}])
def test_data_is_any_json_value_kept_as_parsed(data: Any) -> None:
    parsed = parse(schedule(data=data))
    assert isinstance(parsed, ScheduleTimer) and parsed.data == data


def test_null_data_is_no_data() -> None:
    parsed = parse(schedule(data=None))
    assert isinstance(parsed, ScheduleTimer) and parsed.data is None


def test_data_over_the_bound_is_payload_too_large() -> None:
    body = json.dumps(schedule(data="x" * 100)).encode()
    ok = parse_command("schedule", "acme", body, now=NOW, max_horizon=HORIZON, max_payload_bytes=102)
    assert isinstance(ok, ScheduleTimer)  # "xxx..." is 102 bytes as JSON
    over = parse_command("schedule", "acme", body, now=NOW, max_horizon=HORIZON, max_payload_bytes=101)
    assert isinstance(over, Rejection) and over.reason == "payload_too_large"
    assert over.detail == "data is 102 bytes as its events carry it, more than 101"
    # Measured in UTF-8 bytes, not characters.
    wide = json.dumps(schedule(data="\u00e9" * 50)).encode()
    wide_over = parse_command("schedule", "acme", wide, now=NOW, max_horizon=HORIZON, max_payload_bytes=101)
    assert isinstance(wide_over, Rejection)


def bound(data: bytes, limit: int) -> str | None:
    """The detail of a ScheduleTimer with `data` (its JSON text) under TIMER_MAX_PAYLOAD_BYTES
    `limit`, or None when accepted."""
    body = b'{"tenantId": "acme", "serviceCallId": "sc-42", "dueAt": "2026-11-22T09:00:00Z", "data": '
    parsed = parse_command(
        "schedule", "acme", body + data + b"}", now=NOW, max_horizon=HORIZON, max_payload_bytes=limit
    )
    return parsed.detail if isinstance(parsed, Rejection) else None


@pytest.mark.parametrize(
    ("data", "stored"),
    [
        # What Postgres jsonb prints, which the event carries: a number in plain notation at its
        # full scale, ", " and ": " between members. Compact, these are 8, 9, 13 and 9 bytes.
        (b"[5e-324]", "[0." + "0" * 323 + "5]"),
        (b"[1E+308]", "[1" + "0" * 308 + "]"),
        (b'{"a":[1,2]}', '{"a": [1, 2]}'),
        (b"[1.5e-7]", "[0.00000015]"),
        (b"[1e16, 0.5]", "[10000000000000000, 0.5]"),
        (rb'["\u00e9\n"]', '["\u00e9\\n"]'),  # a character raw in UTF-8, a newline escaped
    ],
)
def test_data_is_measured_as_its_events_carry_it(data: bytes, stored: str) -> None:
    size = len(stored.encode())
    assert bound(data, size) is None
    assert bound(data, size - 1) == f"data is {size} bytes as its events carry it, more than {size - 1}"


def test_tiny_numbers_that_fit_as_received_are_refused_for_what_they_would_deliver() -> None:
    # The 16 KiB of 5e-324 (within the default bound as received): 754,400 bytes as stored.
    data = ("[" + ",".join(["5e-324"] * 2300) + "]").encode()
    assert len(data) <= DEFAULT_MAX_PAYLOAD_BYTES
    assert bound(data, DEFAULT_MAX_PAYLOAD_BYTES) == (
        f"data is {2300 * 326 + 2299 * 2 + 2} bytes as its events carry it,"
        f" more than {DEFAULT_MAX_PAYLOAD_BYTES}"
    )


@pytest.mark.parametrize("body", [b'"a\\u0000b"', b'{"k\\u0000": 1}', b'[["\\ud800"]]', b'{"\\udfff": 1}'])
def test_data_postgres_cannot_store_is_bad_data(body: bytes) -> None:
    rejected = parse(
        b'{"tenantId": "acme", "serviceCallId": "sc-42", "dueAt": "2026-11-22T09:00:00Z", "data": '
        + body
        + b"}"
    )
    assert isinstance(rejected, Rejection) and rejected.reason == "bad_data", rejected


def test_window_and_expire_after_are_kept_as_sent() -> None:
    parsed = parse(schedule(window="PT10M", expireAfter="PT1H"))
    assert isinstance(parsed, ScheduleTimer)
    assert (parsed.window, parsed.expire_after) == ("PT10M", "PT1H")
    plain = parse(schedule(window=None))
    assert isinstance(plain, ScheduleTimer) and (plain.window, plain.expire_after) == (None, None)


@pytest.mark.parametrize("catchup", ["one", "none", "all"])
def test_repeat_catchup_is_kept_as_sent(catchup: str) -> None:
    parsed = parse(schedule(repeat={"every": "PT1H", "catchup": catchup}))
    assert isinstance(parsed, ScheduleTimer) and parsed.repeat is not None
    assert parsed.repeat.catchup == catchup
