"""The headers a timer carries from its ScheduleTimer to its DueTimeReached events: which are kept
when the command comes in (`carried_headers`, intake), and whether the stored ones can still go
on an event (`stored_carried_problem`, firing).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from worker.contract import MAX_CARRIED_VALUE_CHARS, TRACEPARENT, TRACESTATE
from worker.core.fields import _json_type, _show
from worker.tracing import TRACEPARENT_RE


def carried_headers(
    headers: Mapping[str, str] | None, carry: Collection[str]
) -> tuple[dict[str, str] | None, list[str]]:
    """The headers of a ScheduleTimer its DueTimeReached events carry, and the names of those dropped.

    Carried: a valid `traceparent`, a `tracestate` beside it, and the producer headers named in
    `carry` (lower case; TIMER_CARRY_HEADERS), each value printable and at most
    MAX_CARRIED_VALUE_CHARS. Names match in any case; of one name sent in several spellings the
    first valid one is carried. An invalid one is dropped, never a rejection: a timer must not be
    lost for a bad trace header. None when nothing is carried, so a timer without them stores and
    publishes nothing more.
    """
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
        # One per name: "X-A" and "x-a" are two headers to NATS, and without this a command could
        # carry a copy per spelling, past the bound core.eventsize.largest_event holds events to.
        if ok and key not in seen:
            seen.add(key)
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
        # Never a Nats-* header, as intake never stores one (Settings): a Nats-Batch-Commit would
        # end an atomic batch of events early, a Nats-Expected-* get the event refused each time.
        if not _HEADER_NAME_RE.match(name) or name.lower().startswith("nats-"):
            return f"carried headers hold a header name NATS cannot carry: {_show(name)}"
        if not isinstance(value, str) or len(value) > MAX_CARRIED_VALUE_CHARS or not value.isprintable():
            return (
                f"carried header {_show(name)} is not a printable string of at most {MAX_CARRIED_VALUE_CHARS}"
            )
    return None
