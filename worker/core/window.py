"""A firing window (docs/USING.md, Firing window): each occurrence fires at an instant in [dueAt, dueAt
+ window], a hash of the timer and occurrence keyed with the fleet secret: the same on every replica
and after a crash, and out of a tenant's reach to aim or predict."""

from __future__ import annotations

import functools
import re
from datetime import datetime, timedelta

from worker.contract import MessageIds

# Each occurrence fires within this long after its dueAt.
MAX_WINDOW_MS = 86_400_000

# Each part bounded, so the text is short and the arithmetic small whatever a tenant sends.
_SPAN = re.compile(
    r"P(?:(\d{1,3})D)?(?:T(?:(\d{1,5})H)?(?:(\d{1,7})M)?(?:(\d{1,9})(?:[.,](\d{1,3}))?S)?)?\Z", re.ASCII
)


def window_ms(text: str) -> int:
    """The window's length in milliseconds; ValueError, with a one-line reason, when it is none."""
    return span_ms(text, "window", 0, MAX_WINDOW_MS)


@functools.lru_cache(maxsize=1024)
def span_ms(text: str, name: str, least: int, most: int) -> int:
    """A span (`window`, `expireAfter`) in milliseconds, within least..most; ValueError naming it when
    it is none. Cached: firing reads it per occurrence."""
    m = _SPAN.match(text)
    if m is None or text in ("P", "PT") or text.endswith("T"):
        raise ValueError(f"{name} must be an ISO 8601 duration in days, hours, minutes and seconds (PT10M)")
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups()[:4])
    fraction = m.group(5)
    ms = ((((days * 24) + hours) * 60 + minutes) * 60 + seconds) * 1000
    ms += int(fraction.ljust(3, "0")) if fraction else 0
    if not least <= ms <= most:
        raise ValueError(f"{name} must be within {_shown(least)}..{_shown(most)}")
    return ms


def _shown(ms: int) -> str:
    return f"P{ms // 86_400_000}D" if ms and ms % 86_400_000 == 0 else f"PT{ms / 1000:g}S"


def planned_at(
    ids: MessageIds, tenant_id: str, service_call_id: str, due_at: datetime, window: str
) -> datetime:
    """When the occurrence nominally due at `due_at` fires: never before it, at most a window after."""
    offset = ids.spread(tenant_id, service_call_id, due_at, window_ms(window))
    try:
        return due_at + timedelta(milliseconds=offset)
    except OverflowError:
        return datetime.max.replace(tzinfo=due_at.tzinfo)
