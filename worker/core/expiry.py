"""Expiry (docs/USING.md, Expiry): a ScheduleTimer's `expireAfter`, and what becomes of an occurrence
not published within it. Such an occurrence is not fired: its DLQ entry (an ExpiredOccurrence,
reason `expired`) is published instead and, once acknowledged, recorded as the firing would be (a
recurring timer goes on with its next occurrence; a one-shot ends Expired). Counted from the
occurrence's planned instant: its dueAt, or with a firing window the instant planned in it, so a
window never expires what it spreads. Decided once per occurrence, when a replica first comes to
publish it, and committed before it publishes (FiringStore.decide_expiry): every later claim of
that occurrence keeps the decision, so an event id is a DueTimeReached or an ExpiredOccurrence,
never both.

The other occurrences a claim may take and not fire: those a timer whose repeat.catchup is "none"
missed (missed), skipped without a DLQ entry, recorded the same way."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from worker.contract import MAX_DETAIL_CHARS, MessageIds, Occurrence, Outgoing, Subjects, firing_id, iso
from worker.core.domain import Claimed, Key
from worker.core.window import span_ms

# At least a second (a claim's own pace), at most a week.
MIN_EXPIRE_AFTER_MS = 1000
MAX_EXPIRE_AFTER_MS = 7 * 86_400_000


def expire_after_ms(text: str) -> int:
    """`expireAfter` in milliseconds; ValueError, with a one-line reason, when it is none."""
    return span_ms(text, "expireAfter", MIN_EXPIRE_AFTER_MS, MAX_EXPIRE_AFTER_MS)


def late_ms(timer: Occurrence, now_s: float) -> int:
    """How late an occurrence published at `now_s` (epoch seconds) is, against its planned instant."""
    return max(0, round((now_s - timer.due_at.timestamp()) * 1000))


def expiring(due: list[Claimed], now: datetime) -> tuple[list[Claimed], list[Claimed]]:
    """(to publish, expired): those of `due`, about to be published at `now` (the replica's estimate
    of the database clock, never ahead of it: nothing expires early), that are later than their
    expireAfter allows. A stored expireAfter no longer readable (a row written by hand) never
    expires: the occurrence fires, as before expiry existed."""
    if all(c.expire_after is None for c in due):  # nearly always: no cost beyond this test
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
    """(to publish, expired) as decided: those of `due` and `gone` whose keys are in `expired`
    expire, the others publish. An occurrence's first decision stands (FiringStore.decide_expiry):
    one whose claim rolled back after its DueTimeReached was acknowledged is late now, but fires
    again under the same id, deduplicated; it never expires as well."""
    both = due + gone
    return [c for c in both if (c.tenant_id, c.service_call_id) not in expired], [
        c for c in both if (c.tenant_id, c.service_call_id) in expired
    ]


def missed(due: list[Claimed]) -> tuple[list[Claimed], list[Claimed]]:
    """(to publish, to skip): the occurrences of timers whose repeat.catchup is "none" that were
    missed. claim_due found such an occurrence after downtime (it sat due and unclaimed for
    TIMER_DOWNTIME_AFTER) and moved its recurrence reference to the claim, past its dueAt, so the
    next occurrence is the first after now; "none" skips this one too. An on-time claim's
    reference is never past the occurrence's dueAt (sql/queries/firing.sql, claim_due)."""
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
    """The DLQ entry of an occurrence that was not published within `expire_after` of its planned
    instant, `late` milliseconds late, and so is not fired (docs/CONTRACT.md, Expiry): an ExpiredOccurrence
    on the tenant's DLQ subject, with the reason `expired`. Small and bounded: the ids and times,
    never `data`, so it always fits the server's max_payload."""
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
