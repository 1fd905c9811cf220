"""The field checks of the validation boundary (worker.core.commands), each raising `_Reject` with its
reason code (docs/CONTRACT.md, Reason codes).

Ids are opaque: any printable Unicode is accepted, since producers own them; only control characters
(Cc) and lone surrogates (Cs), which cannot be stored, logged or echoed safely, are refused. Inside
`repeat` an unknown key is an error: a misspelt "time" would silently mean "forever"."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, TypeVar

from worker.contract import (
    DUE_AT_RANGE,
    EARLIEST_DUE_AT,
    LABEL_KEY_RULE,
    LATEST_DUE_AT,
    MAX_ID_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MAX_TIMESTAMP_MS,
    Reason,
    Repeat,
    data_json,
)
from worker.core.expiry import expire_after_ms
from worker.core.recurrence import MAX_INDEX, first_cron_occurrence, load_zone, parse_cron, parse_period
from worker.core.window import window_ms

JsonObject = dict[str, Any]
T = TypeVar("T")


class _Reject(Exception):
    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason = reason
        self.detail = detail


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
    if value.isprintable():  # no Cc or Cs: the common case, without a lookup per character
        return value
    for ch in value:
        if unicodedata.category(ch) in ("Cc", "Cs"):
            raise _Reject(reason, f"{key} holds a control character or lone surrogate {_show(ch)}")
    return value


def identifier_problem(value: str, key: str) -> str | None:
    """Why `value` cannot be an id, or None; for ids that come in no command (timer.get)."""
    try:
        _identifier(value, key, "bad_service_call_id")
    except _Reject as exc:
        return exc.detail
    return None


def _correlation(obj: JsonObject) -> str | None:
    value = _optional(obj, "correlationId", str)
    return None if value is None else _identifier(value, "correlationId", "bad_correlation_id")


def _timestamp(obj: JsonObject) -> int | None:
    value = _optional(obj, "timestampMs", int)
    if value is not None and not 0 <= value <= MAX_TIMESTAMP_MS:
        raise _Reject("bad_timestamp", f"timestampMs must be within 0..{MAX_TIMESTAMP_MS}")
    return value


_RFC3339 = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?(?:[Zz]|([+-])(\d{2}):(\d{2}))\Z",
    re.ASCII,
)


def _due_at(text: str) -> datetime:
    """An RFC 3339 date-time with an offset, in UTC. Fractions beyond microseconds (nanoseconds from
    other languages) are truncated; a leap second is refused."""
    m = _RFC3339.match(text)
    if m is None:
        raise _Reject(
            "bad_due_at", f"dueAt {_show(text)} is not RFC 3339 with an offset (2026-11-22T09:00:00Z)"
        )
    year, month, day, hour, minute, second, fraction, sign, hours, minutes = m.groups()
    micros = int(fraction[:6].ljust(6, "0")) if fraction else 0
    offset = None
    if sign is not None:
        if int(minutes) > 59:
            raise _Reject("bad_due_at", f"dueAt {_show(text)} has an offset with minutes past 59")
        offset = timedelta(hours=int(hours), minutes=int(minutes)) * (-1 if sign == "-" else 1)
    try:
        # Out-of-range fields, offsets of 24h or more and instants beyond years 1..9999 land here.
        zone = UTC if offset is None else timezone(offset)
        due = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), micros, zone)
        if zone is not UTC:
            due = due.astimezone(UTC)
    except (ValueError, OverflowError) as exc:
        raise _Reject("bad_due_at", f"dueAt {_show(text)} is not a valid instant: {exc}") from None
    if not EARLIEST_DUE_AT <= due <= LATEST_DUE_AT:
        raise _Reject("bad_due_at", f"dueAt {_show(text)} is outside {DUE_AT_RANGE}")
    return due


_REPEAT_KEYS = frozenset({"every", "cron", "times", "until", "timezone", "catchup"})
CATCHUPS = ("one", "none", "all")


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
    catchup = value.get("catchup")
    if catchup is not None and catchup not in CATCHUPS:
        raise _Reject("bad_repeat", f"repeat.catchup must be one, none or all, not {_show(str(catchup))}")
    return Repeat(every, times, zone, cron=cron, until=until, catchup=catchup)


def _first_occurrence(repeat: Repeat, due_at: datetime) -> datetime:
    """The first occurrence: dueAt, or for `cron` the schedule's first instant at or after it."""
    first = due_at
    if repeat.cron is not None:
        found = first_cron_occurrence(repeat, due_at)
        if found is None:
            raise _Reject("bad_repeat", f"repeat.cron {_show(repeat.cron)} matches no time after dueAt")
        first = found
    if repeat.until is not None and first > repeat.until:
        raise _Reject("bad_repeat", "repeat.until is before the first occurrence: nothing would fire")
    return first


def _window(value: Any) -> str | None:
    return _span(value, "window", "bad_window", window_ms)


def _expire_after(value: Any) -> str | None:
    return _span(value, "expireAfter", "bad_expire_after", expire_after_ms)


def _span(value: Any, key: str, reason: Reason, measure: Callable[[str], int]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Reject(reason, f"{key} must be an ISO 8601 duration string, not {_json_type(value)}")
    try:
        measure(value)
    except ValueError as exc:
        raise _Reject(reason, f"{key} {_show(value)}: {exc}") from None
    return value


def _data(value: Any, limit: int) -> Any:
    """`data`, any JSON value, at most `limit` bytes as its events carry it: measured as Postgres prints
    the stored jsonb, where a float's exponent becomes plain digits, not as received. U+0000 and lone
    surrogates, which jsonb cannot store, are refused here rather than failing the batch's write."""
    if value is None:
        return None
    try:
        size = len(data_json(value).encode("utf-8"))
    except UnicodeEncodeError:
        raise _Reject("bad_data", "data holds a lone surrogate (\\ud800-\\udfff): not text") from None
    nul = False
    stack = [value]
    while stack:  # no recursion: json.loads accepts deeper nesting than Python's stack
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            nul = nul or "\x00" in item
        elif type(item) is float and not 1e-4 <= abs(item) < 1e16:  # else repr is plain: no growth
            size += _plain_growth(item)
    if size > limit:
        raise _Reject("payload_too_large", f"data is {size} bytes as its events carry it, more than {limit}")
    if nul:
        raise _Reject("bad_data", "data holds U+0000 in a string, which Postgres jsonb cannot store")
    return value


_LABEL_KEY = re.compile(rf"{LABEL_KEY_RULE}\Z")


def _labels(value: Any, *, selector: bool = False) -> dict[str, str] | None:
    """A timer's `labels` (empty: none) or a bulk selector (at least one pair); bounded so that a
    timer's labels fit within contract.largest_event whatever a tenant sends."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Reject("bad_labels", f"labels must be an object, not {_json_type(value)}")
    if len(value) > MAX_LABELS:
        raise _Reject("bad_labels", f"labels has {len(value)} pairs, more than {MAX_LABELS}")
    if selector and not value:
        raise _Reject("bad_labels", "labels is empty: a selector names at least one pair")
    for key, label in value.items():
        if _LABEL_KEY.match(key) is None:
            raise _Reject("bad_labels", f"label key {_show(key)} does not match {LABEL_KEY_RULE}")
        if not isinstance(label, str):
            raise _Reject("bad_labels", f"label {key} must be a string, not {_json_type(label)}")
        if len(label) > MAX_LABEL_VALUE_CHARS:
            raise _Reject(
                "bad_labels", f"label {key} has {len(label)} characters, more than {MAX_LABEL_VALUE_CHARS}"
            )
        if not label.isprintable() and any(unicodedata.category(ch) in ("Cc", "Cs") for ch in label):
            raise _Reject("bad_labels", f"label {key} holds a control character or lone surrogate")
    return value or None


def label_problem(labels: dict[str, str]) -> str | None:
    """Why `labels` cannot be labels or a selector, or None; for readers that build them (the CLI)."""
    try:
        _labels(labels, selector=True)
    except _Reject as exc:
        return exc.detail
    return None


def _plain_growth(number: float) -> int:
    """How much longer jsonb prints `number` than its repr: numeric's plain notation at full scale."""
    text = repr(number)
    if "e" not in text:
        return 0
    return len(format(Decimal(text), "f")) - len(text)


_JSON_NAMES: dict[type, str] = {str: "a string", int: "an integer", dict: "an object"}


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array"}
    return "null" if value is None else names.get(type(value), "an object")


def _show(value: str, limit: int = 60) -> str:
    shown = ascii(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
