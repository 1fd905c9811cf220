"""Per-tenant limit on pending timers (TIMER_TENANT_MAX_PENDING; 0 = off, and then never called).

A ScheduleTimer that would create a new pending (Scheduled) timer for a tenant already at the
limit is rejected to the tenant's DLQ with reason `quota_exceeded`. New means: the key is not
Scheduled now (absent, or Cancelled). A reschedule of a Scheduled timer adds nothing, nor does a
ScheduleTimer for a Reached timer (it is ignored), so both always pass.

The check reads Postgres before the batch's transaction, without locks: two replicas taking
commands for the same tenant at the same moment can each see room for the last slots, so a
tenant may overshoot the limit by what the other replicas admit in that same instant (at most
their intake batches). Cancels in the batch are not credited until they are committed (the
next batch sees the room). Both err on the tenant's side or are bounded; neither blocks intake.

It reads in two steps. First a bound per tenant, never below its pending timers and kept by
Postgres beside the rows (migration 0014: it counts timers becoming pending, not ending): a
tenant whose bound leaves room for every ScheduleTimer of the batch passes at the cost of an
index lookup, its keys never read. Only the others are counted exactly (a walk of their rows, up
to the limit) and their keys looked up: a command is refused on an exact count, never on the
bound. The recount also brings the bound down to the count, so a tenant far below its limit is
counted again only once its new timers since could fill it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from worker.contract import ScheduleTimer
from worker.core.commands import Parsed
from worker.core.domain import Key
from worker.core.ports import IntakeStore


def over_quota(
    commands: Sequence[Parsed],
    known: set[Key],
    pending: dict[str, int],
    limit: int,
) -> list[int]:
    """Indexes of the commands to reject, walking the batch in stream order.

    `known`: keys that already hold a Scheduled or Reached timer. `pending`: each tenant's
    Scheduled count (capped above `limit`, which is all that matters).
    """
    known = set(known)
    pending = dict(pending)
    rejected: list[int] = []
    for i, c in enumerate(commands):
        if not isinstance(c, ScheduleTimer):
            continue
        key = (c.tenant_id, c.service_call_id)
        if key in known:
            continue
        if pending.get(c.tenant_id, 0) >= limit:
            rejected.append(i)
            continue
        pending[c.tenant_id] = pending.get(c.tenant_id, 0) + 1
        known.add(key)  # a later command for the same key in this batch is a reschedule
    return rejected


async def over_limit(store: IntakeStore, commands: Sequence[Parsed], limit: int) -> list[int]:
    """Indexes of the ScheduleTimers over their tenant's limit: one short read per batch, and two
    more when a tenant's bound leaves no room for its ScheduleTimers."""
    schedules = Counter(c.tenant_id for c in commands if isinstance(c, ScheduleTimer))
    if not schedules:
        return []
    bounds = await store.pending_bounds(sorted(schedules))
    near = sorted(t for t, n in schedules.items() if bounds.get(t, 0) + n > limit)
    if not near:
        return []
    mine = [(i, c) for i, c in enumerate(commands) if isinstance(c, ScheduleTimer) and c.tenant_id in near]
    keys = list({(c.tenant_id, c.service_call_id) for _, c in mine})
    known, pending = await store.quota_view(keys, near, cap=limit)
    return [mine[j][0] for j in over_quota([c for _, c in mine], known, pending, limit)]
