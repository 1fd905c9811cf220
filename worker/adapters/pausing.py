"""A tenant's or a timer's pause and resume (Store.pause; README, Pause and resume)."""

from __future__ import annotations

from typing import Any

import psycopg

from worker.adapters.queries import QUERIES
from worker.contract import PauseTimers
from worker.core.domain import Applied, Key, Position

# Rows one statement of a tenant's pause or resume moves: each chunk is its own short transaction, so a
# tenant of 100,000 timers never holds their locks (and the claims and commands behind them) at once.
PAUSE_CHUNK = 5000


async def pause(
    conn: psycopg.AsyncConnection[Any], command: PauseTimers, position: Position | None
) -> Applied:
    """Store.pause on one connection: the tenant's flag, then its rows chunk by chunk, each chunk its
    own transaction; or the one timer's row."""
    if command.service_call_id is not None:
        key = (command.tenant_id, command.service_call_id)
        return await pause_one(conn, key, command.resume)
    tenant = {"tenant_id": command.tenant_id}
    flip = {
        **tenant,
        "pause": not command.resume,
        "command_seq": None if position is None else position.seq,
        "command_stored_at": None if position is None else position.stored_at,
    }
    async with conn.transaction():
        first = (await (await conn.execute(QUERIES["pause_tenant"], flip)).fetchone()) is not None
    after, dues = "", []
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                QUERIES["resume_tenant_rows" if command.resume else "pause_tenant_rows"],
                {**tenant, "after": after, "limit": PAUSE_CHUNK},
            )
            rows = await cur.fetchall()
        if command.resume:
            dues += [r[1] for r in rows]
        if len(rows) < PAUSE_CHUNK:
            break
        after = max(r[0] for r in rows)  # RETURNING is in no order
    async with conn.transaction():
        left_query = QUERIES["tenant_left_paused" if command.resume else "tenant_left_scheduled"]
        found = await (await conn.execute(left_query, tenant)).fetchone()
    left = int(found[0]) if found else 0
    return Applied(["deferred" if first or left else "applied"], min(dues, default=None))


async def pause_one(conn: psycopg.AsyncConnection[Any], key: Key, resume: bool) -> Applied:
    params = {"tenant_id": key[0], "service_call_id": key[1]}
    async with conn.transaction():
        cur = await conn.execute(QUERIES["resume_timer" if resume else "pause_timer"], params)
        found = await cur.fetchone()
    if resume:
        return Applied(["ignored" if found is None else "applied"], None if found is None else found[0])
    changed, claimed = found if found is not None else (False, False)
    # A claimed occurrence fires; the pause waits for it to be recorded, as a ScheduleTimer would.
    return Applied(["deferred" if claimed else "applied" if changed else "ignored"], None)
