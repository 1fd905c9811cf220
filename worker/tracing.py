"""OpenTelemetry spans for intake, claim, publish and mark (docs/USING.md, Traces).

Off unless OpenTelemetry's own environment asks for an exporter (`OTEL_EXPORTER_OTLP_ENDPOINT`,
or `OTEL_TRACES_EXPORTER` other than `none`): then `setup` imports the SDK (the `otel` extra)
and every other OTEL_* variable (service name, sampler, headers, batch sizes) is the SDK's to read.
Off, nothing here imports OpenTelemetry and every call is a shared no-op: the loops pay one
attribute read per batch, and nothing per timer.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from worker.errors import ConfigError

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.trace import Span, Tracer

    from worker.contract import Outgoing
    from worker.core.domain import Claimed

_tracer: Tracer | None = None  # set while tracing is on
_provider: Any = None


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

        exporter = OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_* (endpoint, headers, timeout) are its own
    else:
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {','.join(sorted(names))}: only otlp, console or none")
    enable(BatchSpanProcessor(exporter), set_global=True)


def enable(processor: SpanProcessor, *, set_global: bool = False) -> None:
    """Trace through this span processor (tests pass an in-memory exporter's)."""
    global _tracer, _provider
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    _provider = TracerProvider()  # reads OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER
    _provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(_provider)
    _tracer = _provider.get_tracer("timer-service")


def disable() -> None:
    """Flush and turn tracing off."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


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


def publish_spans(due: Sequence[Claimed], messages: list[Outgoing]) -> list[tuple[int, Span]]:
    """One `timer.publish` span per occurrence whose timer carried a traceparent, a child of the
    producer's context; the event's trace context becomes this span's, so the consumer's span
    follows it in the same trace. (index in `due`, span) of each, to end once published."""
    if _tracer is None:
        return []
    from opentelemetry import trace
    from opentelemetry.propagate import extract, inject
    from opentelemetry.trace import SpanKind

    batch = trace.get_current_span().get_span_context()
    started = []
    for i, timer in enumerate(due):
        if timer.carried is None or "traceparent" not in timer.carried:
            continue
        s = _tracer.start_span(
            "timer.publish",
            context=extract(timer.carried),
            kind=SpanKind.PRODUCER,
            links=[trace.Link(batch)] if batch.is_valid else None,
            attributes={
                "timer.tenant_id": timer.tenant_id,
                "timer.service_call_id": timer.service_call_id,
                "timer.due_at": timer.due_at.isoformat(),
                "timer.occurrence_index": timer.occurrence_index,
                "messaging.destination.name": messages[i].subject,
            },
        )
        inject(messages[i].headers, context=trace.set_span_in_context(s))
        started.append((i, s))
    return started


def end_publish_spans(spans: list[tuple[int, Span]], results: Sequence[BaseException | None]) -> None:
    from opentelemetry.trace import StatusCode

    for i, s in spans:
        if (error := results[i]) is not None:
            s.set_status(StatusCode.ERROR, f"{type(error).__name__}: {error}")
        s.end()


def current_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, in hex, for a log line; None when there is none."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return (f"{ctx.trace_id:032x}", f"{ctx.span_id:016x}") if ctx.is_valid else None
