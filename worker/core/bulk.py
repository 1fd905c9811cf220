"""Bulk actions: a cancel, pause or resume of every timer of a tenant carrying a label selector's pairs,
a chunk at a time, each timer as its own command would, so the action needs no rules of its own."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from worker import metrics
from worker.contract import CancelTimer
from worker.core.domain import Applied, BulkAction, Outcome, Position
from worker.core.ports import IntakeStore

log = logging.getLogger(__name__)

# Timers per chunk, one transaction; a cursor moves past each chunk, so none rereads earlier rows.
BULK_CHUNK = 1000
# The worst outcome of a timer wins the action's.
_WORST: tuple[Outcome, ...] = ("deferred", "busy", "stuck")


@dataclass
class Progress:
    """An action's place between its steps: the last key acted on, and the timers so far."""

    after: str = ""
    timers: Counter[Outcome] = field(default_factory=Counter)
    dues: list[datetime] = field(default_factory=list)


class BulkActions:
    """Runs bulk actions a chunk at a time (lane.py holds each one's Progress)."""

    def __init__(self, store: IntakeStore) -> None:
        self.store = store

    async def step(self, action: BulkAction, where: Position, progress: Progress) -> Applied:
        """The next chunk of `action`: "partial" while more may be left; then the action's outcome and
        the soonest dueAt a resume made claimable."""
        ids = await self.store.select_labelled(action, where, progress.after, BULK_CHUNK)
        if ids:
            applied = await self._act(action, ids, where)
            progress.timers.update(applied.outcomes)
            progress.dues += [] if applied.soonest_due is None else [applied.soonest_due]
            progress.after = ids[-1]  # a retry after a failure goes on from here
        if len(ids) == BULK_CHUNK:
            return Applied(["partial"], None)
        outcome: Outcome = next((o for o in _WORST if progress.timers[o]), "applied")
        _count(action, outcome, progress.timers)
        return Applied([outcome], min(progress.dues, default=None))

    async def _act(self, action: BulkAction, ids: list[str], where: Position) -> Applied:
        if action.kind == "cancel":
            cancels = [
                CancelTimer(action.tenant_id, i, action.correlation_id, action.timestamp_ms) for i in ids
            ]
            return await self.store.apply(cancels, [where] * len(ids))
        return await self.store.pause_listed(action, ids, where)


def _count(action: BulkAction, outcome: Outcome, timers: Counter[Outcome]) -> None:
    for timer_outcome, n in timers.items():
        metrics.BULK_TIMERS.labels(action.kind, timer_outcome).inc(n)
    log.info(
        f"bulk {action.kind} applied",
        extra={
            "action": "bulk_applied",
            "kind": action.kind,
            "tenant": action.tenant_id,
            "labels": action.selector,
            "outcome": outcome,
            "timers": dict(timers),
        },
    )
