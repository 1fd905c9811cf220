"""worker/client/tracecontext.py: every command TimerClient sends carries the caller's trace context
when OpenTelemetry is installed, never in place of the caller's own; without it, nothing changes."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS
from opentelemetry.sdk.trace import TracerProvider

from worker.client import TimerClient
from worker.client.tracecontext import trace_headers

tracer = TracerProvider().get_tracer("producer")
OWN = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def traceparent_of(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def test_inside_a_span_the_headers_carry_it_outside_none() -> None:
    assert trace_headers() == {}
    with tracer.start_as_current_span("checkout") as span:
        assert trace_headers() == {"traceparent": traceparent_of(span)}
        assert trace_headers({"TraceParent": OWN}) == {}  # the caller's own, in any case, wins


async def test_schedule_sends_the_current_context_and_keeps_the_callers_own() -> None:
    sent: list[dict[str, str]] = []

    async def publish(subject: str, payload: bytes = b"", **options: Any) -> None:
        sent.append(options["headers"])

    timers = TimerClient(NATS(), "svc")
    timers.js.publish = publish  # type: ignore[method-assign,assignment]
    due = datetime(2030, 1, 1, tzinfo=UTC)
    with tracer.start_as_current_span("checkout") as span:
        await timers.schedule("acme", "sc-1", due)
        await timers.schedule("acme", "sc-2", due, headers={"traceparent": OWN})
        await timers.cancel("acme", "sc-1")
    await timers.schedule("acme", "sc-3", due)
    assert [{k: v for k, v in h.items() if k != "Nats-Msg-Id"} for h in sent] == [
        {"traceparent": traceparent_of(span)},
        {"traceparent": OWN},
        {"traceparent": traceparent_of(span)},
        {},
    ]
    assert all(h["Nats-Msg-Id"] for h in sent)


def test_without_opentelemetry_the_client_sends_plain_commands_and_imports_none_of_it() -> None:
    """A producer without OpenTelemetry installed: importing it fails, as there, and the client's
    commands carry no trace headers; nor does importing the client import OpenTelemetry."""
    script = """
import sys
import worker.client
assert not [m for m in sys.modules if m.startswith("opentelemetry")], "imported with the client"
sys.modules["opentelemetry"] = None  # as if not installed: an import of it raises ImportError
from worker.client.tracecontext import trace_headers
assert trace_headers() == {}, trace_headers()
print("plain")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "plain"), done.stderr
