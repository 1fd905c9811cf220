"""Bulk actions: a cancel, pause or resume on every timer of a tenant that carries all the pairs of a
label selector (docs/CONTRACT.md, Labels), a chunk at a time, each timer as its own command would.

A cancel's chunk goes through IntakeStore.apply as that many CancelTimers at the action's place in the
stream, a pause's or resume's through pause_listed as that many of one timer's own: each timer keeps
the rules of its own commands (stream order, a claimed occurrence fires first, deferred, stuck), so
the action needs no rule of its own but which timers it names (select_labelled).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from datetime import datetime

from worker import metrics
from worker.contract import CancelTimer
from worker.core.domain import Applied, BulkAction, Outcome, Position
from worker.core.ports import IntakeStore

log = logging.getLogger(__name__)

# Timers one chunk reads and acts on, one transaction: the cursor moves past each chunk (keys after
# the last one acted on), so every chunk costs its own rows, never those of the chunks before it (a
# selection starting over each time cost 65.9 s for 1,000,000 timers: quadratic).
BULK_CHUNK = 1000
# Timers one delivery of a bulk action acts on at most, as a tenant's pause (pausing.PAUSE_CHUNK):
# then it is offered again at once ("partial") and the intake batch it came in goes on, so no other
# tenant's command waits behind a big selection for longer than this many timers take.
BULK_PER_DELIVERY = 5000
# Actions whose cursor a replica keeps between deliveries. A delivery to another replica, or past
# this many at once, starts its selection over: correct (every step can run again), only slower.
KEPT_CURSORS = 256
# The worst outcome of a timer wins the action's: each one deferred or busy comes back in the
# next pass of the action; stuck ones are given up visibly, as a CancelTimer's.
_WORST: tuple[Outcome, ...] = ("deferred", "busy", "stuck")


class BulkActions:
    """Runs bulk actions, keeping each one's place (the last key acted on, and whether a timer of an
    earlier delivery must be offered again) between its deliveries, by the action's stream position."""

    def __init__(self, store: IntakeStore) -> None:
        self.store = store
        self._cursors: OrderedDict[Position, tuple[str, Outcome | None]] = OrderedDict()

    async def run(self, action: BulkAction, where: Position) -> Applied:
        """One delivery of `action`: its outcome ("partial": more left, offered again at once) and
        the soonest dueAt a resume made claimable again. The timers it acted on, by their outcome,
        are counted (timer_bulk_timers_total) and logged (bulk_applied)."""
        after, again = self._cursors.pop(where, ("", None))
        timers: Counter[Outcome] = Counter()
        dues: list[datetime] = []
        while True:
            ids = await self.store.select_labelled(action, where, after, BULK_CHUNK)
            if ids:
                applied = await self._act(action, ids, where)
                timers.update(applied.outcomes)
                dues += [] if applied.soonest_due is None else [applied.soonest_due]
                again = next((o for o in _WORST if o == again or timers[o]), None)
                after = ids[-1]
                self._keep(where, after, again)  # a retry after a failure goes on from here
            if len(ids) < BULK_CHUNK or timers.total() >= BULK_PER_DELIVERY:
                break
        outcome: Outcome = "partial" if len(ids) == BULK_CHUNK else again or "applied"
        if outcome != "partial":
            self._cursors.pop(where, None)
        _count(action, outcome, timers)
        return Applied([outcome], min(dues, default=None))

    async def _act(self, action: BulkAction, ids: list[str], where: Position) -> Applied:
        if action.kind == "cancel":
            cancels = [
                CancelTimer(action.tenant_id, i, action.correlation_id, action.timestamp_ms) for i in ids
            ]
            return await self.store.apply(cancels, [where] * len(ids))
        return await self.store.pause_listed(action, ids, where)

    def _keep(self, where: Position, after: str, again: Outcome | None) -> None:
        self._cursors[where] = (after, again)
        self._cursors.move_to_end(where)
        while len(self._cursors) > KEPT_CURSORS:
            self._cursors.popitem(last=False)


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
