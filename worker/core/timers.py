"""A stored timer as the core reads it (StoredTimer, the read port's row type) and the contract's view
of it (timer_view); callers read fields, never column names."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from worker.contract import iso


@dataclass(frozen=True, slots=True)
class StoredTimer:
    """One row of `timers` (sql/schema.sql), the fields a reader may show."""

    tenant_id: str
    service_call_id: str
    state: str  # Paused is stored only, shown as Scheduled
    due_at: datetime | None  # None for a cancel's tombstone
    registered_at: datetime
    updated_at: datetime
    reached_at: datetime | None
    correlation_id: str | None
    attempts: int
    last_error: str | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    repeat_every: str | None
    repeat_times: int | None
    repeat_timezone: str | None
    anchor_due_at: datetime | None
    occurrence_index: int
    fired_count: int
    repeat_cron: str | None
    repeat_until: datetime | None
    data: Any
    # With a firing window, due_at is the planned instant and nominal_due_at the dueAt.
    nominal_due_at: datetime | None
    fire_window: str | None
    expire_after: str | None
    repeat_catchup: str | None
    labels: dict[str, str] | None


def stored_timer(row: dict[str, Any]) -> StoredTimer:
    """The StoredTimer in a row read by column name (other columns left out)."""
    return StoredTimer(**{name: row[name] for name in StoredTimer.__dataclass_fields__})


def timer_view(timer: StoredTimer) -> dict[str, Any]:
    """A stored timer as the read model shows it (camelCase, RFC 3339 times)."""

    def t(value: datetime | None) -> str | None:
        return iso(value) if value is not None else None

    repeat = None
    if timer.repeat_every or timer.repeat_cron:
        repeat = {
            "every": timer.repeat_every,
            "cron": timer.repeat_cron,
            "times": timer.repeat_times,
            "until": t(timer.repeat_until),
            "timezone": timer.repeat_timezone,
            # Only when sent: absent means "one".
            **({} if timer.repeat_catchup is None else {"catchup": timer.repeat_catchup}),
        }
    # Paused is a stored state only: the contract shows Scheduled, with paused true.
    paused = timer.state == "Paused"
    scheduled = timer.state == "Scheduled" or paused
    due, _ = due_and_planned(timer.due_at, timer.nominal_due_at)
    planned = {} if timer.fire_window is None else {"window": timer.fire_window, "plannedAt": t(timer.due_at)}
    return {
        "tenantId": timer.tenant_id,
        "serviceCallId": timer.service_call_id,
        "state": "Scheduled" if paused else timer.state,
        "paused": paused,
        "dueAt": t(due),
        "nextOccurrence": t(due) if scheduled else None,
        # With a window only: its length, and when the occurrence of dueAt is planned to fire.
        **planned,
        **({} if timer.expire_after is None else {"expireAfter": timer.expire_after}),
        "registeredAt": t(timer.registered_at),
        "reachedAt": t(timer.reached_at),
        "correlationId": timer.correlation_id,
        "occurrencesFired": timer.fired_count,
        "repeat": repeat,
        "attempts": timer.attempts,
        "lastError": timer.last_error,
        "data": timer.data,
        "labels": timer.labels or {},
    }


def due_and_planned(
    due_at: datetime | None, nominal_due_at: datetime | None
) -> tuple[datetime | None, datetime | None]:
    """A stored row's dueAt and, with a firing window, its planned instant (the row's due_at, the claim
    key)."""
    return (due_at, None) if nominal_due_at is None else (nominal_due_at, due_at)
