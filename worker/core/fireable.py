"""Which of a claimed batch's rows can fire, and each one's next occurrence under the tenants' time
budgets; the back-off of a row that cannot."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime

from worker import metrics
from worker.contract import DUE_AT_RANGE, EARLIEST_DUE_AT, LATEST_DUE_AT, MessageIds, iso
from worker.core.budget import TenantBudgets
from worker.core.domain import Claimed, Failed, Key, Leased, Unreadable
from worker.core.headers import stored_carried_problem
from worker.core.recurrence import next_of
from worker.core.waiting import Slices
from worker.core.window import planned_at
from worker.errors import verdict

log = logging.getLogger(__name__)

# A failed publish is retried by any replica after this long.
RETRY_BACKOFF_MS = 1000
# A row that cannot become an event backs off, doubling up to this: visible, never spinning the loop.
ROW_RETRY_MAX_MS = 300_000
# Shares of the loop's time for costly next-occurrence arithmetic, per tenant and in all; a row over
# budget is put back for POSTPONE_MS.
NEXT_SHARE = 0.1
NEXT_BURST_S = 0.1
NEXT_TOTAL_SHARE = 0.25
NEXT_TOTAL_BURST_S = 0.25
NEXT_FREE_S = 0.0001
POSTPONE_MS = 1000

# Each firing occurrence's next one, by timer: (when it fires, its index, its dueAt with a window).
Nexts = dict[Key, tuple[datetime | None, int | None, datetime | None]]


def next_budget() -> TenantBudgets:
    """The budget of next-occurrence arithmetic a replica's batches share (both lanes')."""
    return TenantBudgets(NEXT_SHARE, NEXT_BURST_S, NEXT_TOTAL_SHARE, NEXT_TOTAL_BURST_S)


async def fireable(
    claimed: Sequence[Claimed],
    unreadable: Sequence[Unreadable],
    budget: TenantBudgets,
    failed: list[Failed],
    ids: MessageIds,
) -> tuple[list[Claimed], Nexts]:
    """The claimed rows that can fire, earliest due first, and each one's next occurrence. Other rows go
    to `failed`: backed off when they cannot become events, put back when over budget."""
    for u in unreadable:
        cannot_fire(u, "unreadable_due_at", "dueAt cannot be read (infinite, or not in years 1-9999)", failed)
    nexts: Nexts = {}
    postponed = 0
    # The budgets bound each tenant; the slices bound what many tenants add up to in one claim.
    slices = Slices()
    for c in claimed:
        await slices.check()
        # The dueAt, not a window's planned instant, which may be up to a day past LATEST_DUE_AT.
        due = c.due_at if c.nominal_due_at is None else c.nominal_due_at
        if not EARLIEST_DUE_AT <= due <= LATEST_DUE_AT:
            cannot_fire(c, "due_at_out_of_range", f"dueAt {iso(due)} is outside {DUE_AT_RANGE}", failed)
            continue
        if (problem := stored_carried_problem(c.carried)) is not None:
            cannot_fire(c, "bad_carried_headers", problem, failed)
            continue
        recurring = c.repeat_every is not None or c.repeat_cron is not None
        if recurring and not budget.ready(c.tenant_id, costly=c.repeat_cron is not None):
            postponed += 1
            failed.append((c, None, POSTPONE_MS))
            continue
        started = time.perf_counter()
        try:  # computed before the publish: an event goes out only when its row can be recorded
            nxt, index = next_of(c)
            if c.fire_window is None or nxt is None:
                nexts[c.tenant_id, c.service_call_id] = (nxt, index, None)
            else:
                planned = planned_at(ids, c.tenant_id, c.service_call_id, nxt, c.fire_window)
                nexts[c.tenant_id, c.service_call_id] = (planned, index, nxt)
        except Exception as exc:  # whatever the row's values break, the row alone fails
            if verdict(exc) != "alone":
                raise
            cannot_fire(c, "bad_repeat", f"next occurrence: {type(exc).__name__}: {exc}", failed)
        if recurring:
            budget.charge(c.tenant_id, time.perf_counter() - started - NEXT_FREE_S)
    if postponed:
        metrics.POSTPONED.labels("next_occurrence").inc(postponed)
        log.info(
            "recurring timers postponed",
            extra={"action": "postponed", "reason": "next_occurrence", "count": postponed},
        )
    ready = sorted((c for c in claimed if (c.tenant_id, c.service_call_id) in nexts), key=lambda c: c.due_at)
    return ready, nexts


def cannot_fire(timer: Leased, reason: str, error: str, failed: list[Failed]) -> None:
    """One row's failure: recorded on the row and retried with back-off; the batch goes on."""
    backoff_ms = min(ROW_RETRY_MAX_MS, RETRY_BACKOFF_MS * 2 ** min(max(timer.attempts - 1, 0), 20))
    failed.append((timer, error, backoff_ms))
    metrics.FIRE_ERRORS.labels(reason).inc()
    log.warning(
        "timer cannot fire",
        extra={
            "action": "fire_error",
            "reason": reason,
            "error": error,
            "tenant": timer.tenant_id,
            "service_call_id": timer.service_call_id,
            "attempts": timer.attempts,
            "retry_in_ms": backoff_ms,
        },
    )
