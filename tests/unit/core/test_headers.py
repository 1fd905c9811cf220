"""Which ScheduleTimer headers its DueTimeReached events carry (worker.core.headers.carried_headers)."""

from __future__ import annotations

import pytest

from worker.contract import MAX_CARRIED_VALUE_CHARS
from worker.core.headers import carried_headers, stored_carried_problem
from worker.errors import ConfigError
from worker.settings import load_settings

TP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_trace_context_and_allowed_headers_are_carried_the_rest_is_not() -> None:
    headers = {
        "Traceparent": TP,
        "tracestate": "a=1",
        "X-Request-Id": "r",
        "X-Other": "o",
        "Nats-Msg-Id": "m",
    }
    assert carried_headers(headers, {"x-request-id"}) == (
        {"traceparent": TP, "tracestate": "a=1", "X-Request-Id": "r"},
        [],
    )


@pytest.mark.parametrize("none", [None, {}, {"Nats-Msg-Id": "m"}])
def test_nothing_carried_is_none(none: dict[str, str] | None) -> None:
    assert carried_headers(none, {"x-request-id"}) == (None, [])


@pytest.mark.parametrize(
    "bad",
    [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # all-zero parent id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # version ff is invalid
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\n",
        TP + "-extra",
        "garbage",
        "",
    ],
)
def test_an_invalid_traceparent_is_dropped_with_its_tracestate(bad: str) -> None:
    assert carried_headers({"traceparent": bad, "tracestate": "a=1"}, set()) == (
        None,
        ["traceparent", "tracestate"],
    )


def test_values_past_the_bound_or_unprintable_are_dropped_alone() -> None:
    long = "a" * (MAX_CARRIED_VALUE_CHARS + 1)
    headers = {
        "traceparent": TP,
        "tracestate": long,
        "X-Request-Id": "r\x00",
        "X-Ok": "a" * MAX_CARRIED_VALUE_CHARS,
    }
    carried, dropped = carried_headers(headers, {"x-request-id", "x-ok"})
    assert carried == {"traceparent": TP, "X-Ok": "a" * MAX_CARRIED_VALUE_CHARS}
    assert dropped == ["tracestate", "X-Request-Id"]


def test_the_setting_names_headers_case_blind() -> None:
    assert load_settings(carry_headers=" X-Request-Id, baggage ,").carried_names == {
        "x-request-id",
        "baggage",
    }
    assert load_settings().carried_names == frozenset()


@pytest.mark.parametrize("bad", ["Nats-Msg-Id", "X Request", "x:y"])
def test_a_header_name_no_producer_may_send_stops_start_up(bad: str) -> None:
    with pytest.raises(ConfigError, match="TIMER_CARRY_HEADERS"):
        load_settings(carry_headers=bad)


@pytest.mark.parametrize(
    "name",
    [
        "Nats-Batch-Commit",  # on an atomic batch's message before the last: the batch ends there
        "Nats-Batch-Id",
        "Nats-Expected-Last-Sequence",  # the event refused by its stream, every attempt
        "Nats-Rollup",
        "Nats-TTL",
        "nats-expected-stream",
    ],
)
def test_a_stored_nats_header_cannot_go_on_an_event(name: str) -> None:
    # The column is JSON anyone with write access can change (stored_carried_problem says so):
    # intake never stores a Nats-* name (Settings refuses to carry one), so firing must not
    # publish one that was written there by hand either, not only Nats-Msg-Id.
    assert stored_carried_problem({name: "1"}) is not None


def test_one_name_in_several_spellings_is_carried_once() -> None:
    # NATS tells "X-A" from "x-a": each spelling carried, a command could send a copy per spelling
    # of a name, each of MAX_CARRIED_VALUE_CHARS, past the events' bound (core.eventsize.largest_event).
    other = TP.replace("01", "00", 1)
    headers = {"X-A": "1", "x-a": "2", "x-A": "3", "Traceparent": TP, "traceparent": other}
    assert carried_headers(headers, {"x-a"}) == (
        {"X-A": "1", "traceparent": TP},
        ["x-a", "x-A", "traceparent"],
    )


def test_an_invalid_spelling_does_not_take_the_names_place() -> None:
    headers = {"X-A": "\n", "x-a": "ok"}
    assert carried_headers(headers, {"x-a"}) == ({"x-a": "ok"}, ["X-A"])
