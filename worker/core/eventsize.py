"""The most a DueTimeReached weighs, made by the event's own template, so the start-up stream check
holds every event a timer will make."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import NamedTuple

from worker.contract import (
    LATEST_DUE_AT,
    MAX_CARRIED_VALUE_CHARS,
    MAX_ID_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    TRACEPARENT,
    TRACESTATE,
    MessageIds,
    data_json,
    due_event,
    iso,
    wire_size,
)


class OccurrenceValues(NamedTuple):
    """An Occurrence as plain values (largest_event's worst one; the tests')."""

    tenant_id: str
    service_call_id: str
    due_at: datetime
    correlation_id: str | None
    carried: dict[str, str] | None
    data: str | None
    nominal_due_at: datetime | None = None
    labels: str | None = None


def largest_event(max_data_bytes: int, carry: Collection[str]) -> int:
    """The most a DueTimeReached of an accepted timer weighs: every field at its widest and costliest."""
    widest_id = "\U0010ffff" * MAX_ID_CHARS
    widest_value = "\U0010ffff" * MAX_CARRIED_VALUE_CHARS
    carried = {TRACEPARENT: f"00-{'1' * 32}-{'1' * 16}-01", TRACESTATE: widest_value}
    carried |= {name: widest_value for name in carry if name not in carried}
    data = "0" * max_data_bytes if max_data_bytes else None  # 0 refuses any `data`
    # The widest labels as stored: 63-character keys, values of 4-byte characters.
    widest_label = "\U0010ffff" * MAX_LABEL_VALUE_CHARS
    labels = data_json({f"{i:02d}".ljust(63, "k"): widest_label for i in range(MAX_LABELS)})
    worst = OccurrenceValues(
        "t" * 64, widest_id, LATEST_DUE_AT, widest_id, carried, data, LATEST_DUE_AT, labels
    )
    latest_ms = round(LATEST_DUE_AT.timestamp() * 1000)
    event = due_event(worst, "", iso(LATEST_DUE_AT), latest_ms, MessageIds(bytes(16)))
    return wire_size(event)
