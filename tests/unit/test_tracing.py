"""Tracing is off unless OpenTelemetry's environment asks for it; on, log lines name their span, and
intake's span links only to a valid traceparent, whatever else a tenant sends as one."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import SpanLimits
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from worker import tracing
from worker.logs import JsonFormatter


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SERVICE_NAME": "timers"}, False),
    ],
)
def test_tracing_is_wanted_only_when_an_exporter_is_configured(env: dict[str, str], wanted: bool) -> None:
    assert tracing.wanted(env) is wanted


def line(message: str) -> dict[str, object]:
    record = logging.makeLogRecord({"name": "t", "levelname": "INFO", "msg": message})
    loaded: dict[str, object] = json.loads(JsonFormatter().format(record))
    return loaded


def test_off_a_span_is_a_shared_no_op_and_logs_name_none() -> None:
    assert not tracing.on()
    with tracing.span("timer.claim", **{"timer.count": 1}) as span:
        span.set_attribute("timer.count", 2)
        assert "trace_id" not in line("inside")


def test_on_a_log_line_inside_a_span_carries_its_ids(spans: InMemorySpanExporter) -> None:
    with tracing.span("timer.mark"):
        inside = line("inside")
    assert "trace_id" not in line("outside")
    (span,) = spans.get_finished_spans()
    assert span.context is not None
    assert (inside["trace_id"], inside["span_id"]) == (
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
    )


TRACE_ID, SPAN_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
VALID = f"00-{TRACE_ID}-{SPAN_ID}-01"

# What a tenant can put in a command's headers: anything, and near misses of a valid traceparent
# (cut short, followed by more, upper case, huge).
values = st.one_of(
    st.text(max_size=80),
    st.just(VALID),
    st.builds(lambda n, tail: VALID[:n] + tail, st.integers(0, len(VALID)), st.text(max_size=20)),
    st.builds(lambda tail: VALID + tail, st.text(min_size=1, max_size=20)),
    st.just(VALID.upper()),
    st.builds(lambda n: VALID + "0" * n, st.integers(1, 2_000_000)),
)
names = st.sampled_from(
    ["traceparent", "Traceparent", "TRACEPARENT", "tracestate", "X-Other", "traceparent "]
)
headers = st.one_of(st.none(), st.dictionaries(names, values, max_size=4))


@given(st.lists(headers, max_size=8))
@settings(max_examples=300, deadline=None)
def test_a_link_is_made_only_of_a_valid_traceparent_and_anything_else_is_passed_over(
    batch: list[dict[str, str] | None],
) -> None:
    """Whatever a tenant sends, `links` never raises: one link per message whose headers hold a
    valid traceparent (its name in any case), to the context it names; none for any other."""
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter))
    try:
        found = tracing.links(iter(batch))
    finally:
        tracing.disable()
    assert found is not None
    expected = [
        h for h in batch if h and any(k.lower() == "traceparent" and v == VALID for k, v in h.items())
    ]
    assert len(found) == len(expected)
    for link in found:
        assert (link.context.trace_id, link.context.span_id) == (int(TRACE_ID, 16), int(SPAN_ID, 16))
        assert link.context.is_remote and link.context.trace_flags.sampled


def test_links_stop_at_the_sdks_link_limit_and_off_read_nothing(spans: InMemorySpanExporter) -> None:
    found = tracing.links({"traceparent": VALID} for _ in range(1000))
    assert found is not None and len(found) == SpanLimits().max_links == 128
    tracing.disable()

    def unread() -> Iterator[dict[str, str]]:
        raise AssertionError("read while tracing is off")
        yield {}

    assert tracing.links(unread()) is None
