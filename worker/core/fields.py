"""The field checks of the validation boundary (worker.core.commands): the ids, timestampMs, dueAt,
`repeat` (every or cron, times, until, timezone), `window`, `expireAfter`, `data` and `labels`,
each raising `_Reject` with its reason code (docs/CONTRACT.md, Reason codes and Limits). `_Reject`
and the helpers here are the boundary's own: commands.py catches `_Reject` in `parse_command` and
`parse_control`, headers.py quotes values with `_show`. `identifier_problem` is the id rule for
readers of ids that are no commands (timer.get).

Identifiers (serviceCallId, correlationId) are opaque strings: any printable Unicode is accepted,
including non-ASCII and zero-width/format characters (category Cf), because producers own their
ids and rejecting them would lose timers for no safety gain. Rejected are only control characters
(category Cc: NUL, which Postgres text cannot hold, CR/LF, escape sequences for logs) and lone
surrogates (category Cs: not encodable as UTF-8, so they cannot be stored or echoed).

Inside `repeat` an unknown key is an error: a misspelt "time" would silently mean "forever". A
JSON null counts as an absent field.
"""

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
    if value.isprintable():  # no Cc or Cs among them: the common case, without a lookup per character
        return value
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
    year, month, day, hour, minute, second, fraction, sign, hours, minutes = m.groups()
    micros = int(fraction[:6].ljust(6, "0")) if fraction else 0
    # Z, the form nearly every producer sends, is UTC already: no offset to build and undo
    # (issue 21's intake profile).
    offset = None
    if sign is not None:
        if int(minutes) > 59:
            raise _Reject("bad_due_at", f"dueAt {_show(text)} has an offset with minutes past 59")
        offset = timedelta(hours=int(hours), minutes=int(minutes)) * (-1 if sign == "-" else 1)
    try:
        # Out-of-range fields, an offset of 24h or more, or an instant before year 1 or after
        # year 9999 once moved to UTC (0001-01-01T00:00+01:00) all land here.
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
    if catchup is not None and catchup not in CATCHUPS:  # `in` a tuple of str: no unhashable trap
        raise _Reject("bad_repeat", f"repeat.catchup must be one, none or all, not {_show(str(catchup))}")
    return Repeat(every, times, zone, cron=cron, until=until, catchup=catchup)


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


def _window(value: Any) -> str | None:
    """`window`: an ISO 8601 duration of days to seconds, at most a day (worker/core/window.py)."""
    return _span(value, "window", "bad_window", window_ms)


def _expire_after(value: Any) -> str | None:
    """`expireAfter`: as `window`, a second to a week (worker/core/expiry.py)."""
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
    """`data`, any JSON value (null: absent), at most `limit` bytes in UTF-8 as its events carry it.

    Measured as delivered, not as received: stored as jsonb, it is spliced into every event as
    Postgres prints it (contract.data_json's spacing), each number in plain notation at its full
    scale. Measured on the compact text received, 16 KiB of 5e-324 (326 characters each as
    stored) made a 737 KiB event, and at the largest setting events over NATS's 1 MiB max_payload
    that never fired. The stored form, not a new column of the producer's text: that would
    rewrite the table (sql/migrations/0009), and a row stored before is measured at firing anyway
    (BatchFiring._publish). Besides the spacing, only a float's text grows: json.loads makes every
    number with a fraction or an exponent a float, whose repr (the text Jsonb sends) jsonb parses
    as an exact numeric; an integer prints the same digits either way, a string the same escapes.

    Stored as jsonb, which holds any JSON but two kinds of string: U+0000 and (not UTF-8 at
    all) a lone surrogate. Refused here, or the command would fail its whole batch's write.
    """
    if value is None:
        return None
    try:
        size = len(data_json(value).encode("utf-8"))
    except UnicodeEncodeError:
        raise _Reject("bad_data", "data holds a lone surrogate (\\ud800-\\udfff): not text") from None
    nul = False
    stack = [value]
    while stack:  # no recursion: the nesting json.loads accepted may be deeper than Python's stack
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
    """A ScheduleTimer's `labels` (an empty object: none), or a bulk action's selector (at least one
    pair): an object of at most MAX_LABELS string pairs, keys LABEL_KEY_RULE, values at most
    MAX_LABEL_VALUE_CHARS characters, none a control character (a log line's or a header's
    breaker, 6 bytes escaped) or a lone surrogate (no text: Postgres cannot store it). So a
    timer's labels print, as stored, within contract.largest_event's widest ones, whatever a
    tenant sends."""
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
    """Why `labels` cannot be a timer's labels or a selector, or None: the rule of `_labels`, for
    readers that build labels rather than receive them (the CLI's --label)."""
    try:
        _labels(labels, selector=True)
    except _Reject as exc:
        return exc.detail
    return None


def _plain_growth(number: float) -> int:
    """How much longer jsonb prints `number` than its repr: numeric's plain notation at its full
    scale. Python's repr is plain already from 1e-4 to 1e16, the same text; outside, it has an
    exponent, and 5e-324 prints as "0." and 324 decimals, 1e308 as 309 digits. Decimal's "f"
    format is that notation: exact digits, the exponent's scale (tests/integration/test_data_bound.py
    holds it to what Postgres prints). -0.0 counts one more than numeric's 0.0."""
    text = repr(number)
    if "e" not in text:
        return 0
    return len(format(Decimal(text), "f")) - len(text)


_JSON_NAMES: dict[type, str] = {str: "a string", int: "an integer", dict: "an object"}


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array"}
    return "null" if value is None else names.get(type(value), "an object")


def _show(value: str, limit: int = 60) -> str:
    """A value quoted for a detail line: ASCII escapes (ascii()), and clipped."""
    shown = ascii(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."
