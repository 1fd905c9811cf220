"""The caller's OpenTelemetry trace context as NATS headers, for every command TimerClient sends.

OpenTelemetry is optional: a producer that has it installed (opentelemetry-api is enough) and a
span current gets its trace linked to the service's intake span and carried to the timer's
DueTimeReached events; one without it sends the same commands as before, and the client imports
nothing more. Imported on the first command, not with the client: OpenTelemetry's propagators
load their entry points when imported, which a CLI that never sends one should not pay for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from worker.contract import TRACEPARENT


@functools.cache
def _inject() -> Callable[[dict[str, str]], Any] | None:
    try:
        from opentelemetry.propagate import inject
    except ImportError:
        return None
    return inject


def trace_headers(given: Mapping[str, str] | None = None) -> dict[str, str]:
    """The current context's headers as OpenTelemetry's configured propagators write them
    (`traceparent`, `tracestate`, …): none without OpenTelemetry or a current span, and none when
    the caller's own `given` headers hold a traceparent already (in any case: the service reads
    it so), which is then the command's trace context, never replaced."""
    if given and any(name.lower() == TRACEPARENT for name in given):
        return {}
    inject = _inject()
    carrier: dict[str, str] = {}
    if inject is not None:
        inject(carrier)
    return carrier
