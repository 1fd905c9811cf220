"""Per-tenant limit on pending timers (TIMER_TENANT_MAX_PENDING; 0 = off, and then never called).

Read without locks, so concurrent replicas may overshoot by what they admit at once: bounded, and
intake never blocks. A cheap upper bound is read first; only tenants near the limit are counted."""

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
    """Indexes of the commands to reject, walking the batch in stream order; `pending` is capped above
    `limit`."""
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
    """Indexes of the ScheduleTimers over their tenant's limit: one short read, two more near the limit."""
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
