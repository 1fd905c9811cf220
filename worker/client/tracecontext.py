"""The caller's OpenTelemetry trace context as command headers, when installed; imported lazily,
as its propagators load entry points."""

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
    """The current context's propagation headers; none when `given` holds a traceparent."""
    if given and any(name.lower() == TRACEPARENT for name in given):
        return {}
    inject = _inject()
    carrier: dict[str, str] = {}
    if inject is not None:
        inject(carrier)
    return carrier
