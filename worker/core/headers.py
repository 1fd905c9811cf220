"""The headers a timer carries from its ScheduleTimer to its events: which are kept at intake, and
whether the stored ones can still go on an event."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from worker.contract import MAX_CARRIED_VALUE_CHARS, TRACEPARENT, TRACESTATE
from worker.core.fields import _json_type, _show
from worker.tracing import TRACEPARENT_RE


def carried_headers(
    headers: Mapping[str, str] | None, carry: Collection[str]
) -> tuple[dict[str, str] | None, list[str]]:
    """The headers a ScheduleTimer's events carry, and the names of those dropped: a valid traceparent,
    its tracestate and the producer headers in `carry`. An invalid one is dropped, never a rejection:
    a timer must not be lost for a bad trace header."""
    if not headers:
        return None, []
    kept: dict[str, str] = {}
    seen: set[str] = set()
    dropped: list[str] = []
    for name, value in headers.items():
        key = name.lower()
        if key == TRACEPARENT:
            ok = TRACEPARENT_RE.match(value) is not None
        elif key == TRACESTATE or key in carry:
            ok = len(value) <= MAX_CARRIED_VALUE_CHARS and value.isprintable()
        else:
            continue
        # One per name, whatever the spelling, so copies cannot push an event past largest_event's
        # bound.
        if ok and key not in seen:
            seen.add(key)
            kept[key if key in (TRACEPARENT, TRACESTATE) else name] = value
        else:
            dropped.append(name)
    if TRACESTATE in kept and TRACEPARENT not in kept:  # a tracestate belongs to its traceparent
        del kept[TRACESTATE]
        dropped.append(TRACESTATE)
    return kept or None, dropped


# An RFC 7230 token: nats-py refuses any other name when publishing.
_HEADER_NAME_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")


def stored_carried_problem(carried: object) -> str | None:
    """Why a timer's stored carried headers cannot go on its events, or None. The column is JSON anyone
    can write; such a row fails alone."""
    if carried is None:
        return None
    if not isinstance(carried, dict):
        return f"carried headers are {_json_type(carried)}, not an object"
    for name, value in carried.items():
        # Never a Nats-* header: one could end an atomic batch early or get the event refused.
        if not _HEADER_NAME_RE.match(name) or name.lower().startswith("nats-"):
            return f"carried headers hold a header name NATS cannot carry: {_show(name)}"
        if not isinstance(value, str) or len(value) > MAX_CARRIED_VALUE_CHARS or not value.isprintable():
            return (
                f"carried header {_show(name)} is not a printable string of at most {MAX_CARRIED_VALUE_CHARS}"
            )
    return None
