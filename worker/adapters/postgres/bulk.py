"""A bulk action's selection: the chunk of a tenant's timers a label selector names next (select_labelled)."""

from __future__ import annotations

from typing import Any

import psycopg

from worker.adapters.postgres.queries import QUERIES
from worker.core.domain import BulkAction, Position

# Past this many timers after the cursor, a selection walks the key range, not the labels index;
# counted first, as the planner misjudges a rare pair (docs/BENCHMARKS.md, Labels).
FEW = 10_000


def label_terms(tenant_id: str, selector: dict[str, str]) -> list[str]:
    """The timers_labels terms of `selector`, each `<tenant>:<key>=<value>`."""
    return [f"{tenant_id}:{key}={value}" for key, value in sorted(selector.items())]


async def select_labelled(
    conn: psycopg.AsyncConnection[Any], action: BulkAction, position: Position | None, after: str, limit: int
) -> list[str]:
    """The serviceCallIds of up to `limit` timers of the action's tenant after `after`, in key order,
    matching its selector, Scheduled or Paused, and not defined anew after `position`."""
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
        # Planned for these terms each time: a generic plan knows no term (docs/SQL.md).
        cur = await conn.execute(QUERIES["select_labelled"], params, prepare=False)
        return [row[0] for row in await cur.fetchall()]


async def plan_selection(conn: psycopg.AsyncConnection[Any], params: dict[str, Any]) -> None:
    """A chunk's plan settings: the labels index under FEW timers after the cursor, else the key range."""
    await conn.execute(QUERIES["plan_labels_index"])
    cur = await conn.execute(QUERIES["count_labelled"], counted(params), prepare=False)
    if int((await cur.fetchone() or (0,))[0]) >= FEW:
        await conn.execute(QUERIES["plan_key_range"])


def counted(params: dict[str, Any]) -> dict[str, Any]:
    """count_labelled's parameters, from a selection's or a listing's."""
    return {"tenant_id": params["tenant_id"], "after": params["after"], "terms": params["terms"], "cap": FEW}


def plan_listing(conn: psycopg.Connection[Any], params: dict[str, Any]) -> None:
    """The plan settings for a listing of a selector's timers, as select_labelled chooses them."""
    conn.execute(QUERIES["plan_labels_index"])
    row = conn.execute(QUERIES["count_labelled"], counted(params), prepare=False).fetchone()
    if int((row or (0,))[0]) >= FEW:
        conn.execute(QUERIES["plan_key_range"])
