"""The validation boundary (docs/CONTRACT.md, Reason codes and Limits): command bytes in, a typed
command or a Rejection out.

`parse_command` is total: for any bytes it returns a command or a Rejection and never raises.
The checks raise `_Reject` (private, caught only in `parse_command`); everything else that can
fail on input (decoding, JSON, dates, durations, zones) is caught by its specific exception where
it is called.

Identifiers (serviceCallId, correlationId) are opaque strings: any printable Unicode is accepted,
including non-ASCII and zero-width/format characters (category Cf), because producers own their
ids and rejecting them would lose timers for no safety gain. Rejected are only control characters
(category Cc: NUL, which Postgres text cannot hold, CR/LF, escape sequences for logs) and lone
surrogates (category Cs: not encodable as UTF-8, so they cannot be stored or echoed).

Unknown top-level and payload keys are ignored, for forward compatibility. Inside `repeat` an
unknown key is an error: a misspelt "time" would silently mean "forever". A JSON null counts as
an absent field. `timestampMs` is read from the envelope, or from the flat form; when both
envelope and payload carry `correlationId` or `timestampMs`, the envelope's wins.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Collection, Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any, TypeVar

from worker.contract import (
    COMMAND_TYPES,
    CONTROL_TYPES,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DUE_AT_RANGE,
    EARLIEST_DUE_AT,
    INVALID_TENANT,
    LATEST_DUE_AT,
    MAX_BODY_BYTES,
    MAX_CARRIED_VALUE_CHARS,
    MAX_DETAIL_CHARS,
    MAX_ID_CHARS,
    MAX_TIMESTAMP_MS,
    TENANT_RULE,
    TRACEPARENT,
    TRACESTATE,
    CancelTimer,
    Command,
    CommandKind,
    ControlKind,
    PauseTimers,
    Reason,
    Rejection,
    Repeat,
    ScheduleTimer,
    data_json,
    is_valid_tenant,
)
from worker.core.recurrence import MAX_INDEX, first_cron_occurrence, load_zone, parse_cron, parse_period

JsonObject = dict[str, Any]
T = TypeVar("T")


class _Reject(Exception):
    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason = reason
        self.detail = detail


def parse_command(
    kind: CommandKind,
    subject_tenant: str,
    body: bytes,
    *,
    now: datetime,
    max_horizon: timedelta,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Command | Rejection:
    """The command in `body`, received on `<prefix>.<subject_tenant>.timer.<kind>`, or why not.
    `max_payload_bytes` bounds a ScheduleTimer's `data` (TIMER_MAX_PAYLOAD_BYTES)."""
    token = subject_tenant if is_valid_tenant(subject_tenant) else INVALID_TENANT
    try:
        return _parse(kind, subject_tenant, body, now, max_horizon, max_payload_bytes)
    except _Reject as why:
        return Rejection(why.reason, _one_line(why.detail), token)


def _parse(
    kind: CommandKind,
    subject_tenant: str,
    body: bytes,
    now: datetime,
    max_horizon: timedelta,
    max_payload_bytes: int,
) -> Command:
    # Size first: a 10 MB body is turned away before a byte of it is decoded.
    if len(body) > MAX_BODY_BYTES:
        raise _Reject("body_too_large", f"body is {len(body)} bytes, more than {MAX_BODY_BYTES}")
    if not is_valid_tenant(subject_tenant):
        raise _Reject("bad_tenant", f"subject tenant {_show(subject_tenant)} does not match {TENANT_RULE}")
    if kind not in COMMAND_TYPES:
        raise _Reject("unknown_type", f"no command is sent on the {_show(kind)} subject")
    fields, envelope = _unwrap(kind, _load(body))

    tenant = _required(fields, "tenantId", str)
    if not is_valid_tenant(tenant):
        raise _Reject("bad_tenant", f"tenantId {_show(tenant)} does not match {TENANT_RULE}")
    if tenant != subject_tenant:
        raise _Reject("tenant_mismatch", f"tenantId {_show(tenant)} is not the subject's {subject_tenant}")
    outer_tenant = _optional(envelope, "tenantId", str)
    if outer_tenant is not None and outer_tenant != tenant:
        raise _Reject("tenant_mismatch", f"envelope tenantId {_show(outer_tenant)} is not the payload's")

    service_call_id = _identifier(
        _required(fields, "serviceCallId", str), "serviceCallId", "bad_service_call_id"
    )
    # Both levels are checked; the envelope's value wins when both are set.
    correlation_id = _first(_correlation(envelope), _correlation(fields))
    timestamp_ms = _first(_timestamp(envelope), _timestamp(fields))

    if kind == "cancel":
        return CancelTimer(tenant, service_call_id, correlation_id, timestamp_ms)
    due_at = _due_at(_required(fields, "dueAt", str))
    if due_at - now > max_horizon:
        raise _Reject("beyond_horizon", f"dueAt is more than {max_horizon} ahead")
    repeat = _repeat(fields.get("repeat"))
    if repeat is not None:
        due_at = _first_occurrence(repeat, due_at)
    data = _data(fields.get("data"), max_payload_bytes)
    return ScheduleTimer(tenant, service_call_id, due_at, correlation_id, timestamp_ms, repeat, data=data)


def parse_control(kind: ControlKind, subject_tenant: str, body: bytes) -> PauseTimers | Rejection:
    """The PauseTimers or ResumeTimers in `body`, received on `<prefix>.<subject_tenant>.timer.<kind>`
    (kind pause or resume), or why not. The same boundary as parse_command: size, UTF-8, strict
    JSON, the flat or the envelope form, and the body's tenantId must be the subject's, so a tenant
    allowed to publish only on its own subjects can pause only its own timers. Without a
    serviceCallId it is about every timer of the tenant."""
    token = subject_tenant if is_valid_tenant(subject_tenant) else INVALID_TENANT
    try:
        return _parse_control(kind, subject_tenant, body)
    except _Reject as why:
        return Rejection(why.reason, _one_line(why.detail), token)


def _parse_control(kind: ControlKind, subject_tenant: str, body: bytes) -> PauseTimers:
    if len(body) > MAX_BODY_BYTES:
        raise _Reject("body_too_large", f"body is {len(body)} bytes, more than {MAX_BODY_BYTES}")
    if not is_valid_tenant(subject_tenant):
        raise _Reject("bad_tenant", f"subject tenant {_show(subject_tenant)} does not match {TENANT_RULE}")
    if kind not in CONTROL_TYPES:
        raise _Reject("unknown_type", f"no command is sent on the {_show(kind)} subject")
    doc = _load(body)
    envelope: JsonObject = {}
    fields = doc
    if "payload" in doc or "type" in doc:
        name = _required(doc, "type", str)
        if name not in CONTROL_TYPES.values():
            raise _Reject("unknown_type", f"type {_show(name)} is not a pause or resume command")
        if name != CONTROL_TYPES[kind]:
            raise _Reject("type_mismatch", f"type {name} was sent on the {kind} subject")
        fields, envelope = _required(doc, "payload", dict), doc
    tenant = _required(fields, "tenantId", str)
    if not is_valid_tenant(tenant):
        raise _Reject("bad_tenant", f"tenantId {_show(tenant)} does not match {TENANT_RULE}")
    if tenant != subject_tenant:
        raise _Reject("tenant_mismatch", f"tenantId {_show(tenant)} is not the subject's {subject_tenant}")
    outer_tenant = _optional(envelope, "tenantId", str)
    if outer_tenant is not None and outer_tenant != tenant:
        raise _Reject("tenant_mismatch", f"envelope tenantId {_show(outer_tenant)} is not the payload's")
    raw_id = _optional(fields, "serviceCallId", str)
    service_call_id = None if raw_id is None else _identifier(raw_id, "serviceCallId", "bad_service_call_id")
    correlation_id = _first(_correlation(envelope), _correlation(fields))
    return PauseTimers(tenant, service_call_id, kind == "resume", correlation_id)


def _load(body: bytes) -> JsonObject:
    try:
        text = body.decode("utf-8")  # strict: invalid bytes and encoded surrogates fail
    except UnicodeDecodeError as exc:
        raise _Reject("invalid_utf8", f"body is not UTF-8 (byte {exc.start})") from None
    try:
        doc = json.loads(
            text, object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite_float
        )
    # ValueError: syntax, and integers past Python's digit limit; RecursionError: deep nesting.
    except (ValueError, RecursionError) as exc:
        raise _Reject("invalid_json", f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _Reject("wrong_type", f"body must be a JSON object, not {_json_type(doc)}")
    return doc


def _unique_keys(pairs: list[tuple[str, Any]]) -> JsonObject:
    # Called for every object at any depth, with keys already unescaped ("a" and "\u0061" are one key).
    obj: JsonObject = {}
    for key, value in pairs:
        if key in obj:
            raise _Reject("duplicate_key", f"key {_show(key)} appears twice in one object")
        obj[key] = value
    return obj


def _no_constant(name: str) -> float:
    raise _Reject("non_finite_number", f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf without ever spelling "Infinity"
        raise _Reject("non_finite_number", f"number {_show(text)} is out of range")
    return value


def _unwrap(kind: CommandKind, doc: JsonObject) -> tuple[JsonObject, JsonObject]:
    """(the flat command, the envelope or {}). An envelope is told by its "payload" or "type"."""
    if "payload" not in doc and "type" not in doc:
        return doc, {}
    name = _required(doc, "type", str)
    if name not in COMMAND_TYPES.values():
        raise _Reject("unknown_type", f"type {_show(name)} is not a command")
    if name != COMMAND_TYPES[kind]:
        raise _Reject("type_mismatch", f"type {name} was sent on the {kind} subject")
    return _required(doc, "payload", dict), doc


def _required(obj: JsonObject, key: str, kind: type[T]) -> T:
    value = _optional(obj, key, kind)
    if value is None:
        raise _Reject("missing_field", f"{key} is required")
    return value


def _optional(obj: JsonObject, key: str, kind: type[T]) -> T | None:
    value = obj.get(key)
    if value is None:
        return None
    # bool is an int in Python, never in a command.
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _Reject(
            "wrong_type", f"{key} must be {_JSON_NAMES.get(kind, kind.__name__)}, not {_json_type(value)}"
        )
    return value


def _identifier(value: str, key: str, reason: Reason) -> str:
    if not value:
        raise _Reject(reason, f"{key} is empty")
    if len(value) > MAX_ID_CHARS:
        raise _Reject(reason, f"{key} has {len(value)} characters, more than {MAX_ID_CHARS}")
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise _Reject(reason, f"{key} holds a control character or lone surrogate {_show(ch)}")
    return value


def identifier_problem(value: str, key: str) -> str | None:
    """Why `value` cannot be an id (the rule of serviceCallId and correlationId), or None. For
    readers of ids that are no commands: timer.get."""
    try:
        _identifier(value, key, "bad_service_call_id")
    except _Reject as exc:
        return exc.detail
    return None


def _correlation(obj: JsonObject) -> str | None:
    value = _optional(obj, "correlationId", str)
    return None if value is None else _identifier(value, "correlationId", "bad_correlation_id")


def _first(outer: T | None, inner: T | None) -> T | None:
    return inner if outer is None else outer


def _timestamp(obj: JsonObject) -> int | None:
    value = _optional(obj, "timestampMs", int)
    if value is not None and not 0 <= value <= MAX_TIMESTAMP_MS:
        raise _Reject("bad_timestamp", f"timestampMs must be within 0..{MAX_TIMESTAMP_MS}")
    return value


# RFC 3339 date-time. The offset is required; "T", "t" or " " separate date and time.
_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:[Zz]|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,  # \d is 0-9 only, not every Unicode digit
)


def _due_at(text: str) -> datetime:
    """An RFC 3339 date-time with an explicit offset, in UTC, within DUE_AT_RANGE. Fractions beyond
    microseconds are truncated (producers in other languages send nanoseconds); a leap second (:60)
    is refused."""
    m = _RFC3339.match(text)
    if m is None:
        raise _Reject(
            "bad_due_at", f"dueAt {_show(text)} is not RFC 3339 with an offset (2026-11-22T09:00:00Z)"
        )
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    micros = int((m[7] or "").ljust(6, "0")[:6])
    offset = timedelta(0)
    if m[8] is not None:
        if int(m[10]) > 59:
            raise _Reject("bad_due_at", f"dueAt {_show(text)} has an offset with minutes past 59")
        offset = timedelta(hours=int(m[9]), minutes=int(m[10])) * (-1 if m[8] == "-" else 1)
    try:
        # Out-of-range fields, an offset of 24h or more, or an instant before year 1 or after
        # year 9999 once moved to UTC (0001-01-01T00:00+01:00) all land here.
        due = datetime(year, month, day, hour, minute, second, micros, timezone(offset)).astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise _Reject("bad_due_at", f"dueAt {_show(text)} is not a valid instant: {exc}") from None
    if not EARLIEST_DUE_AT <= due <= LATEST_DUE_AT:
        raise _Reject("bad_due_at", f"dueAt {_show(text)} is outside {DUE_AT_RANGE}")
    return due


_REPEAT_KEYS = frozenset({"every", "cron", "times", "until", "timezone"})


def _repeat(value: Any) -> Repeat | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Reject("bad_repeat", f"repeat must be an object, not {_json_type(value)}")
    unknown = sorted(set(value) - _REPEAT_KEYS)
    if unknown:
        raise _Reject("bad_repeat", f"repeat has unknown key {_show(unknown[0])}")
    every, cron = value.get("every"), value.get("cron")
    times, zone = value.get("times"), value.get("timezone")
    if (every is None) == (cron is None):
        raise _Reject("bad_repeat", "repeat needs exactly one of every (a period) and cron (an expression)")
    if cron is not None:
        if not isinstance(cron, str):
            raise _Reject("bad_repeat", "repeat.cron must be a cron expression string")
        try:
            parse_cron(cron)
        except ValueError as exc:
            raise _Reject("bad_repeat", f"repeat.cron {_show(cron)}: {exc}") from None
    elif not isinstance(every, str):
        raise _Reject("bad_repeat", "repeat.every must be an ISO 8601 duration string")
    else:
        try:
            parse_period(every)
        except ValueError as exc:
            raise _Reject("bad_repeat", f"repeat.every {_show(every)}: {exc}") from None
    until = value.get("until")
    if until is not None:
        if not isinstance(until, str):
            raise _Reject("bad_repeat", f"repeat.until must be an RFC 3339 string, not {_json_type(until)}")
        try:
            until = _due_at(until)
        except _Reject as exc:
            raise _Reject("bad_repeat", "repeat.until" + exc.detail.removeprefix("dueAt")) from None
    if times is not None and (type(times) is not int or not 1 <= times <= MAX_INDEX):
        raise _Reject("bad_repeat", f"repeat.times must be an integer within 1..{MAX_INDEX}")
    if zone is not None:
        if not isinstance(zone, str):
            raise _Reject("bad_repeat", "repeat.timezone must be a string")
        if load_zone(zone) is None:
            raise _Reject("unknown_timezone", f"repeat.timezone {_show(zone)} is not an IANA time zone")
    return Repeat(every, times, zone, cron=cron, until=until)


def _first_occurrence(repeat: Repeat, due_at: datetime) -> datetime:
    """The timer's first occurrence: dueAt for `every`; for `cron`, the first instant of the
    schedule at or after dueAt (dueAt is when the schedule starts). Either must come by `until`."""
    first = due_at
    if repeat.cron is not None:
        found = first_cron_occurrence(repeat, due_at)
        if found is None:
            raise _Reject("bad_repeat", f"repeat.cron {_show(repeat.cron)} matches no time after dueAt")
        first = found
    if repeat.until is not None and first > repeat.until:
        raise _Reject("bad_repeat", "repeat.until is before the first occurrence: nothing would fire")
    return first


def _data(value: Any, limit: int) -> Any:
    """`data`, any JSON value (null: absent), at most `limit` bytes as compact JSON in UTF-8.

    Stored as jsonb, which holds any JSON but two kinds of string: U+0000 and (not UTF-8 at
    all) a lone surrogate. Refused here, or the command would fail its whole batch's write.
    """
    if value is None:
        return None
    try:
        size = len(data_json(value).encode("utf-8"))
    except UnicodeEncodeError:
        raise _Reject("bad_data", "data holds a lone surrogate (\\ud800-\\udfff): not text") from None
    if size > limit:
        raise _Reject("payload_too_large", f"data is {size} bytes as JSON, more than {limit}")
    stack = [value]
    while stack:  # no recursion: the nesting json.loads accepted may be deeper than Python's stack
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and "\x00" in item:
            raise _Reject("bad_data", "data holds U+0000 in a string, which Postgres jsonb cannot store")
    return value


_JSON_NAMES: dict[type, str] = {str: "a string", int: "an integer", dict: "an object"}


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array"}
    return "null" if value is None else names.get(type(value), "an object")


def _show(value: str, limit: int = 60) -> str:
    """A value quoted for a detail line: ASCII escapes (ascii()), and clipped."""
    shown = ascii(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _one_line(detail: str) -> str:
    # Goes into a NATS header and a log line: printable ASCII only, no CR/LF, bounded.
    clean = "".join(ch if " " <= ch <= "~" else "?" for ch in detail)
    return clean[:MAX_DETAIL_CHARS]


# W3C Trace Context, version 00's layout (https://www.w3.org/TR/trace-context/#traceparent-header).
_TRACEPARENT_RE = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}\Z")


def carried_headers(
    headers: Mapping[str, str] | None, carry: Collection[str]
) -> tuple[dict[str, str] | None, list[str]]:
    """The headers of a ScheduleTimer its DueTimeReached events carry, and the names of those dropped.

    Carried: a valid `traceparent`, a `tracestate` beside it, and the producer headers named in
    `carry` (lower case; TIMER_CARRY_HEADERS), each value printable and at most
    MAX_CARRIED_VALUE_CHARS. Names match in any case. An invalid one is dropped, never a
    rejection: a timer must not be lost for a bad trace header. None when nothing is carried, so
    a timer without them stores and publishes nothing more.
    """
    if not headers:
        return None, []
    kept: dict[str, str] = {}
    dropped: list[str] = []
    for name, value in headers.items():
        key = name.lower()
        if key == TRACEPARENT:
            ok = _TRACEPARENT_RE.match(value) is not None
        elif key == TRACESTATE or key in carry:
            ok = len(value) <= MAX_CARRIED_VALUE_CHARS and value.isprintable()
        else:
            continue
        if ok:
            kept[key if key in (TRACEPARENT, TRACESTATE) else name] = value
        else:
            dropped.append(name)
    if TRACESTATE in kept and TRACEPARENT not in kept:  # a tracestate belongs to its traceparent
        del kept[TRACESTATE]
        dropped.append(TRACESTATE)
    return kept or None, dropped


# A header name NATS clients send: an RFC 7230 token (nats-py refuses any other when publishing).
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


def stored_carried_problem(carried: object) -> str | None:
    """Why a timer's stored carried headers cannot go on its events, or None when they can. They
    were valid when stored (carried_headers), but the column is JSON anyone can write: a list, a
    number, a CR/LF that would end the header block. Such a row fails alone (Firing.fire)."""
    if carried is None:
        return None
    if not isinstance(carried, dict):
        return f"carried headers are {_json_type(carried)}, not an object"
    for name, value in carried.items():
        if not _HEADER_NAME_RE.match(name) or name.lower() == "nats-msg-id":
            return f"carried headers hold a header name NATS cannot carry: {_show(name)}"
        if not isinstance(value, str) or len(value) > MAX_CARRIED_VALUE_CHARS or not value.isprintable():
            return (
                f"carried header {_show(name)} is not a printable string of at most {MAX_CARRIED_VALUE_CHARS}"
            )
    return None
