"""A bulk action's selection: the chunk of a tenant's timers a label selector names next (select_labelled)."""

from __future__ import annotations

from typing import Any

import psycopg

from worker.adapters.postgres.queries import QUERIES
from worker.core.domain import BulkAction, Position

# Timers after the cursor a selector may carry for its rows to be read through the labels index (a
# bitmap of them, sorted); past this many, through the tenant's key range in order. Counted first
# (count_labelled): the planner's guess of a rare pair, from the statistics' least common terms,
# was 2.5 % of the tenant, and it walked the key range for a page of one that had ten of 1,000,000
# (18.6 s, docs/BENCHMARKS.md, Labels).
FEW = 10_000


def label_terms(tenant_id: str, selector: dict[str, str]) -> list[str]:
    """The terms of the timers_labels index (sql/migrations/0017, timer_label_terms) a timer of
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
    async with conn.transaction():  # the plan settings are this transaction's (SET LOCAL)
        await plan_selection(conn, params)
        # Planned for these terms each time, never as a prepared statement's generic plan, which
        # knows no term (docs/SQL.md, select_labelled).
        cur = await conn.execute(QUERIES["select_labelled"], params, prepare=False)
        return [row[0] for row in await cur.fetchall()]


async def plan_selection(conn: psycopg.AsyncConnection[Any], params: dict[str, Any]) -> None:
    """In the open transaction of `conn`, the plan settings for the selection of a chunk: the labels
    index for fewer than FEW timers after the cursor, else the key range (count_labelled)."""
    await conn.execute(QUERIES["plan_labels_index"])
    cur = await conn.execute(QUERIES["count_labelled"], counted(params), prepare=False)
    if int((await cur.fetchone() or (0,))[0]) >= FEW:
        await conn.execute(QUERIES["plan_key_range"])


def counted(params: dict[str, Any]) -> dict[str, Any]:
    """count_labelled's parameters, from a selection's or a listing's."""
    return {"tenant_id": params["tenant_id"], "after": params["after"], "terms": params["terms"], "cap": FEW}


def plan_listing(conn: psycopg.Connection[Any], params: dict[str, Any]) -> None:
    """In the open transaction of `conn`, the plan settings for a listing of a selector's timers
    (a page of `list --label`, the console's filter), as select_labelled chooses them."""
    conn.execute(QUERIES["plan_labels_index"])
    row = conn.execute(QUERIES["count_labelled"], counted(params), prepare=False).fetchone()
    if int((row or (0,))[0]) >= FEW:
        conn.execute(QUERIES["plan_key_range"])
