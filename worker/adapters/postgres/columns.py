"""upsert_schedules' array parameters, a column per field of a batch's ScheduleTimers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg.types.json import Jsonb

from worker.contract import MessageIds, ScheduleTimer
from worker.core.window import planned_at


def jsonb_column(values: list[Any]) -> list[Jsonb | None] | None:
    """A jsonb[] parameter, or NULL when every value is None (unnest pads it with NULLs)."""
    if all(v is None for v in values):
        return None
    return [None if v is None else Jsonb(v) for v in values]


def schedule_columns(sched: Sequence[ScheduleTimer], ids: MessageIds | None) -> dict[str, Any]:
    """upsert_schedules' columns from the commands themselves; `ids` plans the firing windows."""
    repeats = [c.repeat for c in sched]
    expiring = any(c.expire_after is not None for c in sched)
    return {
        "tenant_id": [c.tenant_id for c in sched],
        "service_call_id": [c.service_call_id for c in sched],
        "due_at": [c.due_at for c in sched],
        "correlation_id": [c.correlation_id for c in sched],
        "command_ts": [c.timestamp_ms for c in sched],
        "repeat_every": [r.every if r else None for r in repeats],
        "repeat_times": [r.times if r else None for r in repeats],
        "repeat_timezone": [r.timezone if r else None for r in repeats],
        "repeat_cron": [r.cron if r else None for r in repeats],
        "repeat_until": [r.until if r else None for r in repeats],
        "repeat_catchup": [r.catchup if r else None for r in repeats],
        "data": jsonb_column([c.data for c in sched]),
        "labels": jsonb_column([c.labels for c in sched]),
        "carried_headers": jsonb_column([c.carried for c in sched]),
        # As data: NULL (no array) when none has an expiry, as most.
        "expire_after": [c.expire_after for c in sched] if expiring else None,
    } | _windows(sched, ids)


def _windows(sched: Sequence[ScheduleTimer], ids: MessageIds | None) -> dict[str, Any]:
    """The window columns: each `window` and its first planned instant; NULL when none has one."""
    if all(c.window is None for c in sched):
        return {"fire_window": None, "planned_at": None}
    if ids is None:
        raise RuntimeError("Store.ids is not set: the fleet secret plans firing windows")
    return {
        "fire_window": [c.window for c in sched],
        "planned_at": [
            None if c.window is None else planned_at(ids, c.tenant_id, c.service_call_id, c.due_at, c.window)
            for c in sched
        ],
    }
