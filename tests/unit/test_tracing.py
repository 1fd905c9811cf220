"""Tracing is off unless OpenTelemetry's environment asks for it; on, log lines name their span."""

from __future__ import annotations

import json
import logging

import pytest
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
