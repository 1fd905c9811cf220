"""The bound on what a DueTimeReached counts against NATS's max_payload (core.eventsize.largest_event,
wire_size), and the start-up check that the settings keep every event within the server's
(streams.check_sizes)."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.js import api

from worker.adapters.jetstream.streams import check_sizes
from worker.contract import (
    EARLIEST_DUE_AT,
    LATEST_DUE_AT,
    MAX_BODY_BYTES,
    MAX_ID_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MessageIds,
    data_json,
    due_event,
    iso,
    wire_size,
)
from worker.core.eventsize import OccurrenceValues, largest_event
from worker.core.headers import carried_headers
from worker.errors import ConfigError
from worker.settings import load_settings

IDS = MessageIds(b"a fleet secret of thirty-two b..")
MIB = 1024 * 1024


ids = st.text(st.characters(blacklist_categories=("Cc", "Cs")), min_size=1, max_size=MAX_ID_CHARS)
instants = st.datetimes(
    EARLIEST_DUE_AT.replace(tzinfo=None),
    LATEST_DUE_AT.replace(tzinfo=None),
    timezones=st.just(EARLIEST_DUE_AT.tzinfo),
)
header_values = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=600)
header_names = st.sampled_from(["traceparent", "tracestate", "X-A", "x-a", "x-B", "X-b", "x-c"])


@settings(derandomize=True, database=None, max_examples=300)
@given(
    tenant=st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True),
    service_call_id=ids,
    correlation_id=st.none() | ids,
    due_at=instants,
    planned_at=st.none() | instants,
    reached_at=instants,
    headers=st.dictionaries(header_names, header_values | st.just("00-" + "a" * 32 + "-" + "b" * 16 + "-01")),
    limit=st.integers(0, MAX_BODY_BYTES),
    text=st.text(st.characters(blacklist_categories=("Cs",)), max_size=2000),
)
def test_no_event_of_an_accepted_timer_is_larger_than_the_bound(
    tenant: str,
    service_call_id: str,
    correlation_id: str | None,
    due_at: datetime,
    planned_at: datetime | None,
    reached_at: datetime,
    headers: dict[str, str],
    limit: int,
    text: str,
) -> None:
    carry = {"x-a", "x-b"}
    carried, _ = carried_headers(headers, carry)
    # `data` as stored, at most `limit` bytes (worker.core.fields._data): the longest such text.
    data = text.encode()[:limit].decode(errors="ignore") or None
    # With a firing window, due_at is the planned instant and the event says both (plannedAt).
    nominal, fire_at = (None, due_at) if planned_at is None else (due_at, planned_at)
    timer = OccurrenceValues(tenant, service_call_id, fire_at, correlation_id, carried, data, nominal)
    event = due_event(timer, "svc.t.timer.due", iso(reached_at), round(reached_at.timestamp() * 1000), IDS)
    assert wire_size(event) <= largest_event(limit, carry)


def test_the_bound_is_reached() -> None:
    """Not a loose guess: the worst ids, headers, `data` and labels make an event of exactly the bound."""
    widest = "\U0010ffff" * MAX_ID_CHARS
    value = "\U0010ffff" * 512
    carried = {"traceparent": "00-" + "1" * 32 + "-" + "1" * 16 + "-01", "tracestate": value, "x-a": value}
    labels = data_json(
        {f"{i:02d}".ljust(63, "k"): "\U0010ffff" * MAX_LABEL_VALUE_CHARS for i in range(MAX_LABELS)}
    )
    timer = OccurrenceValues(
        "t" * 64, widest, LATEST_DUE_AT, widest, carried, "1" * 100, LATEST_DUE_AT, labels=labels
    )
    reached = round(LATEST_DUE_AT.timestamp() * 1000)
    event = due_event(timer, "s", iso(LATEST_DUE_AT), reached, IDS)
    assert wire_size(event) == largest_event(100, {"x-a"})


def stream(max_msg_size: int = -1) -> api.StreamConfig:
    return api.StreamConfig(name="TIMER_EVENTS", max_msg_size=max_msg_size)


def test_the_defaults_and_the_largest_data_fit_nats_default_max_payload() -> None:
    check_sizes(load_settings(), MIB, stream())
    check_sizes(load_settings(max_payload_bytes=MAX_BODY_BYTES, carry_headers="x-a,x-b"), MIB, stream())


def test_data_too_large_for_the_server_is_refused_naming_the_setting_and_what_fits() -> None:
    settings = load_settings(max_payload_bytes=MAX_BODY_BYTES)
    overhead = largest_event(1, set()) - 1  # the event without its `data` but with its "data" key
    with pytest.raises(ConfigError) as refused:
        check_sizes(settings, 64 * 1024, stream())
    fits = 64 * 1024 - overhead
    assert str(refused.value) == (
        f"TIMER_MAX_PAYLOAD_BYTES=65536 lets a DueTimeReached event reach {65536 + overhead} bytes,"
        f" more than the NATS server's max_payload (65536): set it to at most {fits}"
    )
    check_sizes(load_settings(max_payload_bytes=fits), 64 * 1024, stream())  # exactly what it said


def test_a_smaller_max_msg_size_of_the_events_stream_is_named() -> None:
    with pytest.raises(ConfigError, match=r"more than stream TIMER_EVENTS's max_msg_size \(40000\): set it"):
        check_sizes(load_settings(), MIB, stream(max_msg_size=40000))


def test_a_limit_too_small_for_an_event_without_data_says_to_raise_it() -> None:
    """Ids, the widest labels and trace context make 23.8 KB before any data or producer header."""
    with pytest.raises(
        ConfigError, match=r"^events can reach 23800 bytes without data .* \(20000\): raise it$"
    ):
        check_sizes(load_settings(max_payload_bytes=0), MIB, stream(max_msg_size=20000))


def test_carried_headers_alone_too_large_name_their_setting() -> None:
    names = ",".join(f"x-{i}" for i in range(600))
    with pytest.raises(ConfigError, match=r"^TIMER_CARRY_HEADERS: events carrying 600 producer headers"):
        check_sizes(load_settings(max_payload_bytes=0, carry_headers=names), MIB, stream())
