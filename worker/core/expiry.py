"""Expiry (docs/USING.md, Expiry): an occurrence not published within `expireAfter` of its planned
instant is not fired; its DLQ entry is published and recorded instead. Decided once per occurrence
and committed before publishing, so an event id is a DueTimeReached or an ExpiredOccurrence, never
both. Missed occurrences of catch-up "none" timers are skipped, recorded the same way."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from worker.contract import MAX_DETAIL_CHARS, MessageIds, Occurrence, Outgoing, Subjects, firing_id, iso
from worker.core.domain import Claimed, Key
from worker.core.window import span_ms

MIN_EXPIRE_AFTER_MS = 1000
MAX_EXPIRE_AFTER_MS = 7 * 86_400_000


def expire_after_ms(text: str) -> int:
    """`expireAfter` in milliseconds; ValueError, with a one-line reason, when it is none."""
    return span_ms(text, "expireAfter", MIN_EXPIRE_AFTER_MS, MAX_EXPIRE_AFTER_MS)


def late_ms(timer: Occurrence, now_s: float) -> int:
    """How late an occurrence published at `now_s` (epoch seconds) is, against its planned instant."""
    return max(0, round((now_s - timer.due_at.timestamp()) * 1000))


def expiring(due: list[Claimed], now: datetime) -> tuple[list[Claimed], list[Claimed]]:
    """(to publish, expired) at `now`, never ahead of the database clock, so nothing expires early. An
    unreadable stored expireAfter never expires."""
    if all(c.expire_after is None for c in due):  # nearly always
        return due, []
    now_s = now.timestamp()
    gone: list[Claimed] = []
    keep: list[Claimed] = []
    for c in due:
        try:
            late = c.expire_after is not None and late_ms(c, now_s) > expire_after_ms(c.expire_after)
        except ValueError:
            late = False
        (gone if late else keep).append(c)
    return keep, gone


def honour(due: list[Claimed], gone: list[Claimed], expired: set[Key]) -> tuple[list[Claimed], list[Claimed]]:
    """(to publish, expired) as decided: an occurrence's first decision stands, so a re-claimed one that
    was acknowledged fires again, deduplicated, never expires as well."""
    both = due + gone
    return [c for c in both if (c.tenant_id, c.service_call_id) not in expired], [
        c for c in both if (c.tenant_id, c.service_call_id) in expired
    ]


def missed(due: list[Claimed]) -> tuple[list[Claimed], list[Claimed]]:
    """(to publish, to skip): missed occurrences of catch-up "none" timers, whose recurrence reference
    claim_due moved past their dueAt after downtime."""
    if all(c.repeat_catchup != "none" for c in due):  # nearly always
        return due, []
    keep: list[Claimed] = []
    skip: list[Claimed] = []
    for c in due:
        nominal = c.due_at if c.nominal_due_at is None else c.nominal_due_at
        (skip if c.repeat_catchup == "none" and c.recurrence_ref > nominal else keep).append(c)
    return keep, skip


def expired_entry(
    timer: Occurrence, subjects: Subjects, expire_after: str, late: int, ids: MessageIds
) -> Outgoing:
    """The DLQ entry (an ExpiredOccurrence) of an occurrence not published within `expire_after`. Never
    `data`, so it always fits the server's max_payload."""
    nominal = timer.nominal_due_at
    due = timer.due_at if nominal is None else nominal
    event_id = firing_id(timer.tenant_id, timer.service_call_id, due)
    body: dict[str, Any] = {
        "type": "ExpiredOccurrence",
        "id": event_id,
        "tenantId": timer.tenant_id,
        "serviceCallId": timer.service_call_id,
        "correlationId": timer.correlation_id,
        "dueAt": iso(due),
    }
    if nominal is not None:
        body["plannedAt"] = iso(timer.due_at)
    body |= {"expireAfter": expire_after, "lateMs": late}
    detail = f"not published within expireAfter {expire_after}: {late} ms late"
    headers = {
        "Timer-Error": "expired",
        "Timer-Error-Detail": detail[:MAX_DETAIL_CHARS],
        "Timer-Subject": subjects.due(timer.tenant_id),
        "Nats-Msg-Id": ids.expired(event_id),
    }
    return Outgoing(subjects.of(timer.tenant_id, "dlq"), json.dumps(body).encode(), headers)
