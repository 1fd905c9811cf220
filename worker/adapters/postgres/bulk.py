"""A bulk action's selection: the chunk of a tenant's timers a label selector names next (select_labelled)."""

from __future__ import annotations

from typing import Any

import psycopg

from worker.adapters.postgres.queries import QUERIES
from worker.core.domain import BulkAction, Position


def label_terms(tenant_id: str, selector: dict[str, str]) -> list[str]:
    """The terms of the timers_labels index (sql/migrations/0016, timer_label_terms) a timer of
    `tenant_id` carrying every pair of `selector` has, each `<tenant>:<key>=<value>`."""
    return [f"{tenant_id}:{key}={value}" for key, value in sorted(selector.items())]


async def select_labelled(
    conn: psycopg.AsyncConnection[Any], action: BulkAction, position: Position | None, after: str, limit: int
) -> list[str]:
    """The serviceCallIds of up to `limit` timers of the action's tenant after `after`, in key order,
    carrying every pair of its selector, Scheduled or Paused, and not defined anew later in the stream than
    `position` (a ScheduleTimer after the action is the newer word on its timer)."""
    params = {
        "tenant_id": action.tenant_id,
        "terms": label_terms(action.tenant_id, action.selector),
        "after": after,
        "limit": limit,
        "command_seq": None if position is None else position.seq,
        "command_stored_at": None if position is None else position.stored_at,
    }
    # Planned for these terms each time, never as a prepared statement's generic plan: that plan
    # knows no term, so it cannot tell a rare pair (the labels index) from a common one (the key
    # range), and took one way for both (docs/SQL.md, select_labelled).
    cur = await conn.execute(QUERIES["select_labelled"], params, prepare=False)
    return [row[0] for row in await cur.fetchall()]
