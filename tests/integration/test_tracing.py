"""worker/tracing.py, trace context end to end: a ScheduleTimer's traceparent, tracestate and allowed
producer headers reach each of its DueTimeReached events (docs/CONTRACT.md, Trace context), on real
Postgres and NATS."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.propagate import inject
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.helpers import due_events, iso_in, jetstream, message_ids, row, running_replica, until
from worker.config import Settings

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


async def schedule(js: Any, settings: Settings, body: dict[str, Any], headers: dict[str, str]) -> None:
    subject = f"{settings.subject_prefix}.{body['tenantId']}.timer.schedule"
    await js.publish(subject, json.dumps(body).encode(), headers=headers)


async def test_a_producers_trace_context_and_allowed_headers_reach_every_occurrence(
    settings: Settings, db_url: str
) -> None:
    headers = {
        "traceparent": TRACEPARENT,
        "tracestate": "vendor=opaque",
        "X-Request-Id": "req-7",  # allowed below
        "X-Internal": "never carried",  # not allowed
        "Nats-Msg-Id": "cmd-1",  # the command's, never the event's
    }
    body = {
        "tenantId": "acme",
        "serviceCallId": "sc-traced",
        "dueAt": iso_in(0.5, db_url),
        "repeat": {"every": "PT1S", "times": 3},
    }
    async with running_replica(settings, carry_headers="X-Request-Id"), jetstream(settings) as js:
        await schedule(js, settings, body, headers)
        events = await due_events(js, settings, 3)
    assert [e["payload"]["serviceCallId"] for e, _ in events] == ["sc-traced"] * 3
    for event, got in events:
        assert got == {
            "traceparent": TRACEPARENT,
            "tracestate": "vendor=opaque",
            "X-Request-Id": "req-7",
            "Nats-Msg-Id": message_ids(db_url).event(event["id"]),
        }
    assert len({e["id"] for e, _ in events}) == 3


async def test_an_invalid_traceparent_is_dropped_and_the_timer_still_fires(
    settings: Settings, db_url: str
) -> None:
    headers = {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01", "tracestate": "vendor=opaque"}
    body = {"tenantId": "acme", "serviceCallId": "sc-bad-trace", "dueAt": iso_in(0.3, db_url)}
    async with running_replica(settings), jetstream(settings) as js:
        await schedule(js, settings, body, headers)
        ((event, got),) = await due_events(js, settings, 1)
    assert got == {
        "Nats-Msg-Id": message_ids(db_url).event(event["id"])
    }  # nor the tracestate of a traceparent that was dropped
    stored = row(db_url, "acme", "sc-bad-trace")
    assert stored is not None and stored["state"] == "Reached" and stored["carried_headers"] is None


async def test_a_timer_without_trace_headers_stores_none(settings: Settings, db_url: str) -> None:
    body = {"tenantId": "acme", "serviceCallId": "sc-plain", "dueAt": iso_in(0.3, db_url)}
    async with running_replica(settings), jetstream(settings) as js:
        await schedule(js, settings, body, {"Nats-Msg-Id": "cmd-plain"})
        ((event, got),) = await due_events(js, settings, 1)
    assert got == {"Nats-Msg-Id": message_ids(db_url).event(event["id"])}
    stored = row(db_url, "acme", "sc-plain")
    assert stored is not None and stored["carried_headers"] is None


async def test_a_trace_passes_from_the_producer_through_the_timer_to_the_consumer(
    settings: Settings, db_url: str, spans: InMemorySpanExporter
) -> None:
    producer = TracerProvider().get_tracer("producer")
    with producer.start_as_current_span("checkout") as checkout:
        headers: dict[str, str] = {}
        inject(headers)
    body = {"tenantId": "acme", "serviceCallId": "sc-otel", "dueAt": iso_in(0.3, db_url)}
    async with running_replica(settings), jetstream(settings) as js:
        await schedule(js, settings, body, headers)
        ((event, got),) = await due_events(js, settings, 1)
        await until(lambda: any(s.name == "timer.mark" for s in spans.get_finished_spans()), what="mark span")
    finished = spans.get_finished_spans()
    assert {"timer.intake", "timer.claim", "timer.publish", "timer.mark"} <= {s.name for s in finished}
    (per_timer,) = [s for s in finished if s.name == "timer.publish" and s.kind == SpanKind.PRODUCER]
    producer_ctx = checkout.get_span_context()
    assert per_timer.context is not None and per_timer.parent is not None
    assert per_timer.context.trace_id == producer_ctx.trace_id
    assert per_timer.parent.span_id == producer_ctx.span_id
    assert per_timer.attributes is not None and per_timer.attributes["timer.service_call_id"] == "sc-otel"
    # The consumer's context: the same trace, with the service's publish span as parent.
    assert got["traceparent"].startswith(f"00-{producer_ctx.trace_id:032x}-{per_timer.context.span_id:016x}-")
    assert got["Nats-Msg-Id"] == message_ids(db_url).event(event["id"])
    (mark,) = [s for s in finished if s.name == "timer.mark"]
    assert mark.attributes is not None and (
        mark.attributes["timer.marked"],
        mark.attributes["timer.fenced"],
    ) == (1, 0)
