"""OpenTelemetry spans for intake, claim, publish and record (docs/OPERATIONS.md, Traces), and the
W3C traceparent rule.

Off unless OpenTelemetry's environment asks for an exporter; off, nothing imports OpenTelemetry
and every call is a shared no-op. A span's name never holds a tenant's subject: backends group
by name, so it stays one of a few.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

from worker.contract import TRACEPARENT, firing_id
from worker.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.trace import Link, Span, SpanContext, Tracer

    from worker.contract import Outgoing
    from worker.core.domain import Claimed

# W3C Trace Context, version 00: anchored, so `match` reads at most 55 characters of what a tenant sent.
TRACEPARENT_RE = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}\Z")

_tracer: Tracer | None = None  # set while tracing is on
_provider: Any = None
_max_links: int | None = None  # the SDK's span link limit

SYSTEM = "nats"
_OPERATION_TYPES = {"process": "process", "publish": "send", "create": "create"}
Operation = Literal["process", "publish", "create"]
Kind = Literal["consumer", "client"]


def on() -> bool:
    return _tracer is not None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether OpenTelemetry's standard environment variables ask for traces to be exported."""
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter == "none" or env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return bool(exporter or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


def setup() -> None:
    """Turn tracing on when the environment asks for it (see `wanted`); a replica calls this once."""
    if not wanted():
        return
    try:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        raise ConfigError(
            "OTEL_EXPORTER_OTLP_ENDPOINT: tracing needs the otel extra (pip install 'timer-service[otel]')"
        ) from None
    exporter: SpanExporter
    names = {n.strip() for n in os.environ.get("OTEL_TRACES_EXPORTER", "otlp").lower().split(",")}
    if names <= {"console"}:
        exporter = ConsoleSpanExporter()
    elif names <= {"otlp", "console", ""}:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()  # reads OTEL_EXPORTER_OTLP_*
    else:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {','.join(sorted(names))}: only otlp, console or none")
    enable(BatchSpanProcessor(exporter), set_global=True)


def enable(processor: SpanProcessor, *, set_global: bool = False) -> None:
    """Trace through this span processor (tests pass an in-memory exporter's)."""
    global _tracer, _provider, _max_links
    from opentelemetry import trace
    from opentelemetry.sdk.trace import SpanLimits, TracerProvider

    _provider = TracerProvider()  # reads the other OTEL_* variables
    _max_links = SpanLimits().max_links
    _provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(_provider)
    _tracer = _provider.get_tracer("timer-service")


def disable() -> None:
    """Flush and turn tracing off."""
    global _tracer, _provider, _max_links
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = _max_links = None


class _NoSpan:
    def set_attribute(self, key: str, value: Any) -> None:
        pass


_NO_SPAN = _NoSpan()


@contextlib.contextmanager
def _no_span() -> Iterator[_NoSpan]:
    yield _NO_SPAN


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A span around one batch's step, current inside the block (so logs name it)."""
    if _tracer is None:
        return _no_span()
    return _tracer.start_as_current_span(name, attributes=attributes)


def messaging_span(
    operation: Operation,
    destination: str,
    kind: Kind,
    attributes: Mapping[str, Any],
    links: Sequence[Link] | None = None,
) -> contextlib.AbstractContextManager[Any]:
    """A span around one batch's messaging operation; `destination` never one tenant's subject."""
    if _tracer is None:
        return _no_span()
    from opentelemetry.trace import SpanKind

    return _tracer.start_as_current_span(
        f"{operation} {destination}",
        kind=SpanKind.CONSUMER if kind == "consumer" else SpanKind.CLIENT,
        links=links,
        attributes=_messaging(operation) | dict(attributes),
    )


class Headed(Protocol):
    """A received message, as far as its span reads it (nats-py's Msg is one)."""

    @property
    def headers(self) -> Mapping[str, str] | None: ...


def process_span(
    stream: str, consumer: str, msgs: Sequence[Headed]
) -> contextlib.AbstractContextManager[Any]:
    """Intake's span of one fetched batch, linked to each command's producer's trace."""
    if _tracer is None:
        return _no_span()
    return messaging_span(
        "process",
        stream,
        "consumer",
        {
            "messaging.destination.name": stream,
            "messaging.consumer.group.name": consumer,
            "messaging.batch.message_count": len(msgs),
        },
        links(m.headers for m in msgs),
    )


def _messaging(operation: Operation) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.operation.type": _OPERATION_TYPES[operation],
        "messaging.operation.name": operation,
    }


def links(headers: Iterable[Mapping[str, str] | None]) -> list[Link] | None:
    """A link to each message's valid traceparent, up to the SDK's limit; links, not a parent: a
    batch has as many parents as messages. An invalid header is passed over. None while off."""
    if _tracer is None:
        return None
    from opentelemetry.trace import Link

    found: list[Link] = []
    for each in headers:
        if _max_links is not None and len(found) >= _max_links:
            break
        if each and (context := _remote(each)) is not None:
            found.append(Link(context))
    return found


def _remote(headers: Mapping[str, str]) -> SpanContext | None:
    """The remote span context of a message's first valid traceparent header, or None."""
    from opentelemetry.trace import SpanContext, TraceFlags

    for name, value in headers.items():
        if len(name) == len(TRACEPARENT) and name.lower() == TRACEPARENT and TRACEPARENT_RE.match(value):
            _, trace_id, span_id, flags = value.split("-")
            return SpanContext(int(trace_id, 16), int(span_id, 16), True, TraceFlags(int(flags, 16)))
    return None


def create_spans(due: Sequence[Claimed], messages: list[Outgoing], template: str) -> list[tuple[int, Span]]:
    """A `create` span per occurrence carrying a traceparent, a child of the producer's context,
    linked both ways to the current publish span; the event carries it. (index in `due`, span)."""
    if _tracer is None:
        return []
    from opentelemetry import trace
    from opentelemetry.propagate import extract, inject
    from opentelemetry.trace import SpanKind

    publish = trace.get_current_span()
    batch = publish.get_span_context()
    started = []
    for i, timer in enumerate(due):
        if timer.carried is None or TRACEPARENT not in timer.carried:
            continue
        nominal = timer.nominal_due_at or timer.due_at  # as due_event makes the id
        s = _tracer.start_span(
            f"create {template}",
            context=extract(timer.carried),
            kind=SpanKind.PRODUCER,
            links=[trace.Link(batch)] if batch.is_valid else None,
            attributes=_messaging("create")
            | {
                "messaging.destination.name": messages[i].subject,
                "messaging.destination.template": template,
                "messaging.message.id": firing_id(timer.tenant_id, timer.service_call_id, nominal),
                "timer.tenant_id": timer.tenant_id,
                "timer.service_call_id": timer.service_call_id,
                "timer.due_at": timer.due_at.isoformat(),
                "timer.occurrence_index": timer.occurrence_index,
            },
        )
        inject(messages[i].headers, context=trace.set_span_in_context(s))
        publish.add_link(s.get_span_context())
        started.append((i, s))
    return started


def end_create_spans(spans: list[tuple[int, Span]], results: Sequence[BaseException | None]) -> None:
    """End each occurrence's span once its event was acknowledged, or failed: then with the error."""
    from opentelemetry.trace import StatusCode

    for i, s in spans:
        if (error := results[i]) is not None:
            s.set_attribute("error.type", type(error).__name__)
            s.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        s.end()


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, in hex, for a log line; or None."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}") if ctx.is_valid else None
