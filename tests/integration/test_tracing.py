"""worker/tracing.py, trace context end to end: a ScheduleTimer's traceparent, tracestate and allowed
producer headers reach each of its DueTimeReached events (docs/CONTRACT.md, Trace context); with
tracing on, the spans of intake and firing as OpenTelemetry's messaging conventions name them, and
intake's linked to the producer's trace TimerClient sent (docs/OPERATIONS.md, Traces); on real
Postgres and NATS."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from tests.helpers import due_events, iso_in, jetstream, message_ids, row, running_replica, until
from worker.client import TimerClient
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
    """TimerClient injects the producer's context; intake's span links to it; the occurrence's
    create span is its child and the context its DueTimeReached carries; every span named and
    attributed as OpenTelemetry's messaging conventions say."""
    producer = TracerProvider().get_tracer("producer")  # not the service's: as in another process
    body = {"tenantId": "acme", "serviceCallId": "sc-otel", "dueAt": iso_in(0.3, db_url)}
    async with running_replica(settings), jetstream(settings) as js, client_of(settings) as timers:
        with producer.start_as_current_span("checkout") as checkout:
            await timers.schedule("acme", "sc-otel", datetime.fromisoformat(body["dueAt"]))
        ((event, got),) = await due_events(js, settings, 1)
        await until(lambda: any(s.name == "timer.mark" for s in spans.get_finished_spans()), what="mark span")
    finished = spans.get_finished_spans()
    events = f"{settings.subject_prefix}.*.timer.due"
    names = {s.name for s in finished}
    assert {f"process {settings.command_stream}", "timer.claim", f"publish {events}", "timer.mark"} <= names
    assert not any("acme" in name for name in names)  # a tenant's subject is never a span's name
    producer_ctx = checkout.get_span_context()

    (process,) = [s for s in finished if s.name == f"process {settings.command_stream}"]
    assert process.kind == SpanKind.CONSUMER
    assert [(link.context.trace_id, link.context.span_id) for link in process.links] == [
        (producer_ctx.trace_id, producer_ctx.span_id)
    ]
    assert dict(process.attributes or {}) | {"timer.rejected": 0, "timer.valid": 1} == {
        "messaging.system": "nats",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": settings.command_stream,
        "messaging.consumer.group.name": settings.consumer,
        "messaging.batch.message_count": 1,
        "timer.rejected": 0,
        "timer.valid": 1,
    }

    (create,) = [s for s in finished if s.name == f"create {events}"]
    assert create.kind == SpanKind.PRODUCER and create.context is not None and create.parent is not None
    assert create.context.trace_id == producer_ctx.trace_id
    assert create.parent.span_id == producer_ctx.span_id
    attributes = create.attributes or {}
    assert {k: attributes[k] for k in attributes if k.startswith("messaging.")} == {
        "messaging.system": "nats",
        "messaging.operation.type": "create",
        "messaging.operation.name": "create",
        "messaging.destination.name": f"{settings.subject_prefix}.acme.timer.due",
        "messaging.destination.template": events,
        "messaging.message.id": event["id"],
    }
    assert attributes["timer.service_call_id"] == "sc-otel"

    (publish,) = [s for s in finished if s.name == f"publish {events}"]
    assert publish.kind == SpanKind.CLIENT and publish.context is not None
    assert [link.context.span_id for link in publish.links] == [create.context.span_id]
    assert [link.context.span_id for link in create.links] == [publish.context.span_id]
    assert (publish.attributes or {})["messaging.operation.type"] == "send"
    assert (publish.attributes or {})["messaging.batch.message_count"] == 1
    # The consumer's context: the same trace, with the service's create span as parent.
    assert got["traceparent"].startswith(f"00-{producer_ctx.trace_id:032x}-{create.context.span_id:016x}-")
    assert got["Nats-Msg-Id"] == message_ids(db_url).event(event["id"])
    (record,) = [s for s in finished if s.name == "timer.mark"]
    assert record.attributes is not None and (
        record.attributes["timer.marked"],
        record.attributes["timer.fenced"],
    ) == (1, 0)


async def test_every_command_the_client_sends_links_intake_to_its_producers_trace(
    settings: Settings, db_url: str, spans: InMemorySpanExporter
) -> None:
    """schedule_many and cancel too, not only schedule: each command carries the caller's context."""
    producer = TracerProvider().get_tracer("producer")
    due = datetime.now(UTC) + timedelta(hours=1)
    many = [{"tenantId": "acme", "serviceCallId": f"sc-{i}", "dueAt": due} for i in range(3)]
    async with running_replica(settings), client_of(settings) as timers:
        with producer.start_as_current_span("bulk") as bulk:
            assert [s.outcome for s in await timers.schedule_many(many)] == ["accepted"] * 3
            await timers.cancel("acme", "sc-0")
        await until(lambda: len(linked(spans)) == 4, what="4 linked commands")
        await until(lambda: (row(db_url, "acme", "sc-0") or {}).get("state") == "Cancelled", what="cancel")
    ctx = bulk.get_span_context()
    assert linked(spans) == [(ctx.trace_id, ctx.span_id)] * 4


def linked(spans: InMemorySpanExporter) -> list[tuple[int, int]]:
    """The producer contexts intake's spans link to, in the order they came."""
    return [
        (link.context.trace_id, link.context.span_id)
        for s in spans.get_finished_spans()
        if s.name.startswith("process ")
        for link in s.links
    ]


async def test_a_malformed_or_huge_traceparent_gets_no_link_and_its_command_is_applied(
    settings: Settings, db_url: str, spans: InMemorySpanExporter
) -> None:
    """What a tenant writes in a traceparent never fails intake: the commands of the batch are all
    applied, and only the valid one is linked (tests/unit/test_tracing.py proves it for any header)."""
    hostile = [
        "00-" + "a" * 60_000,  # huge
        f"00-{TRACE_ID}-00f067aa0ba902b7",  # cut short
        f"00-{'0' * 32}-00f067aa0ba902b7-01",  # all-zero trace id
        f"ff-{TRACE_ID}-00f067aa0ba902b7-01",  # the forbidden version
        "\u00e9" * 50,
    ]
    async with running_replica(settings), jetstream(settings) as js:
        for i, value in enumerate(hostile):
            body = {"tenantId": "acme", "serviceCallId": f"sc-{i}", "dueAt": iso_in(3600)}
            await schedule(js, settings, body, {"traceparent": value})
        body = {"tenantId": "acme", "serviceCallId": "sc-valid", "dueAt": iso_in(3600)}
        await schedule(js, settings, body, {"TraceParent": TRACEPARENT})  # any case, as carried
        stored = [f"sc-{i}" for i in range(len(hostile))] + ["sc-valid"]
        # Each batch's span ends once its commands are answered: all six, then what they linked.
        await until(lambda: processed(spans) == len(stored), what="every command's batch span ended")
    assert all(row(db_url, "acme", k) for k in stored)
    assert linked(spans) == [(int(TRACE_ID, 16), int("00f067aa0ba902b7", 16))]
    assert sum(batch_attribute(spans, "timer.rejected")) == 0


def processed(spans: InMemorySpanExporter) -> int:
    """How many commands intake's ended spans took."""
    return sum(batch_attribute(spans, "messaging.batch.message_count"))


def batch_attribute(spans: InMemorySpanExporter, name: str) -> list[int]:
    return [
        int((s.attributes or {}).get(name, 0))  # type: ignore[arg-type]
        for s in spans.get_finished_spans()
        if s.name.startswith("process ")
    ]


@contextlib.asynccontextmanager
async def client_of(settings: Settings) -> AsyncIterator[TimerClient]:
    async with await TimerClient.connect(settings.nats_url, settings.subject_prefix) as timers:
        yield timers
