"""A tenant's or timers' pauses and resumes (Store.pause, pause_timers; docs/USING.md, Pause and resume)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg

from worker.adapters.postgres.queries import QUERIES
from worker.contract import PauseTimers
from worker.core.domain import Applied, Key, Outcome, Position

# Rows one statement of a tenant's pause or resume moves, each chunk a short transaction of its own.
PAUSE_CHUNK = 5000
# Rows one step moves at most ("partial": the bulk lane steps it again), so other tenants get turns.
PAUSE_ROWS_PER_STEP = PAUSE_CHUNK


# Advisory locks one intake transaction holds at most, so the shared lock table holds every
# replica's: past this many tenants it locks their hashed slots instead.
TENANT_LOCKS = 32


def intake_lock_keys(tenants: Iterable[str]) -> list[int]:
    """The advisory lock keys intake holds shared while it writes these tenants' timers, sorted:
    each tenant's own, or, past TENANT_LOCKS tenants, their slots'. A pause takes both."""
    distinct = set(tenants)
    if len(distinct) <= TENANT_LOCKS:
        return sorted({_lock_key(t) for t in distinct})
    return sorted({_slot_key(t) for t in distinct})


def pause_lock_keys(tenant: str) -> list[int]:
    """The keys a tenant's pause or resume takes exclusively: its own and its slot's, ascending as
    every transaction takes them, so no two wait in a cycle."""
    return sorted({_lock_key(tenant), _slot_key(tenant)})


def tenant_lock_keys(tenants: Iterable[str], purpose: bytes) -> list[int]:
    """Advisory lock keys of these tenants for another `purpose` than the pause fence, sorted."""
    return sorted({_lock_key(t, purpose) for t in tenants})


def _lock_key(tenant: str, purpose: bytes = b"timer-pause") -> int:
    """A tenant's own key; a collision only makes two tenants wait for each other's flag change."""
    digest = hashlib.blake2b(tenant.encode(), digest_size=8, person=purpose).digest()
    return int.from_bytes(digest, "big", signed=True)


def _slot_key(tenant: str) -> int:
    """A tenant's slot's key: 0 to TENANT_LOCKS - 1."""
    return _lock_key(tenant) % TENANT_LOCKS


async def pause(
    conn: psycopg.AsyncConnection[Any],
    command: PauseTimers,
    position: Position | None,
    stuck_after: timedelta,
) -> Applied:
    """Store.pause on one connection: the tenant's flag, then its rows chunk by chunk; or one row."""
    if command.service_call_id is not None:
        return await pause_timers(conn, [command], [position])
    tenant = {"tenant_id": command.tenant_id}
    flip = {
        **tenant,
        "pause": not command.resume,
        "command_seq": None if position is None else position.seq,
        "command_stored_at": None if position is None else position.stored_at,
    }
    async with conn.transaction():
        # Waits for the intake transactions that read the old flag; every later one reads the new.
        await conn.execute(QUERIES["lock_tenant"], {"keys": pause_lock_keys(command.tenant_id)})
        await conn.execute(QUERIES["pause_tenant"], flip)
    dues, more = await _move_rows(conn, command)
    if more:
        return Applied(["partial"], min(dues, default=None))
    left, claimed, stuck = await _left(conn, command, stuck_after)
    if left > claimed:
        # Rows a record or a command held as the chunks passed: once more now, not a lease later.
        dues += (await _move_rows(conn, command))[0]
        left, claimed, stuck = await _left(conn, command, stuck_after)
    # Claimed rows fire first (their record honours the flag); only rows stuck behind a claim: given up.
    outcome: Outcome = "applied" if left == 0 else "stuck" if left == stuck else "deferred"
    return Applied([outcome], min(dues, default=None))


async def _move_rows(conn: psycopg.AsyncConnection[Any], command: PauseTimers) -> tuple[list[Any], bool]:
    """Move up to PAUSE_ROWS_PER_STEP rows: (their dueAts on resume, whether more may be left)."""
    after, dues, moved = "", [], 0
    while True:
        async with conn.transaction():
            cur = await conn.execute(
                QUERIES["resume_tenant_rows" if command.resume else "pause_tenant_rows"],
                {"tenant_id": command.tenant_id, "after": after, "limit": PAUSE_CHUNK},
            )
            rows = await cur.fetchall()
        moved += len(rows)
        if command.resume:
            dues += [r[1] for r in rows]
        if len(rows) < PAUSE_CHUNK:
            return dues, False
        if moved >= PAUSE_ROWS_PER_STEP:
            return dues, True
        after = max(r[0] for r in rows)  # RETURNING is in no order


async def _left(
    conn: psycopg.AsyncConnection[Any], command: PauseTimers, stuck_after: timedelta
) -> tuple[int, int, int]:
    """Rows left in the old state: (all, those claimed, those stuck behind an old claim)."""
    left_query = QUERIES["tenant_left_paused" if command.resume else "tenant_left_scheduled"]
    params = {"tenant_id": command.tenant_id, "stuck_after": stuck_after}
    async with conn.transaction():
        found = await (await conn.execute(left_query, params)).fetchone()
    return (int(found[0]), int(found[1]), int(found[2])) if found else (0, 0, 0)


async def pause_timers(
    conn: psycopg.AsyncConnection[Any], commands: Sequence[PauseTimers], positions: Sequence[Position | None]
) -> Applied:
    """Timers' own pauses and resumes, in one statement: each one's outcome, in order (no row:
    ignored). One older in the stream than its timer's last pause or resume changes nothing."""
    keys = [(c.tenant_id, c.service_call_id) for c in commands if c.service_call_id is not None]
    if len(keys) < len(commands):
        raise ValueError("pause_timers takes one timer's pauses and resumes, not a tenant's")
    found, soonest = await _control(conn, keys, [c.resume for c in commands], positions)
    return Applied([found.get(key, "ignored") for key in keys], soonest)


async def pause_listed(
    conn: psycopg.AsyncConnection[Any],
    tenant_id: str,
    service_call_ids: Sequence[str],
    resume: bool,
    position: Position | None,
    terms: list[str] | None = None,
) -> Applied:
    """Timers' pauses or resumes by key, in one transaction: the outcome of each that exists and
    carries `terms` (None: any), in key order."""
    keys = [(tenant_id, i) for i in sorted(service_call_ids)]
    found, soonest = await _control(conn, keys, [resume] * len(keys), [position] * len(keys), terms)
    return Applied([found[key] for key in keys if key in found], soonest)


async def _control(
    conn: psycopg.AsyncConnection[Any],
    keys: Sequence[Key],
    resume: Sequence[bool],
    positions: Sequence[Position | None],
    terms: list[str] | None = None,
) -> tuple[dict[Key, Outcome], datetime | None]:
    """control_timers in a transaction of its own: each key's outcome, and the soonest dueAt resumed."""
    if len(set(keys)) < len(keys):  # the statement would change such a timer once, as one of them
        raise ValueError("control_timers takes each timer once")
    known = any(p is not None for p in positions)  # else NULL: unnest pads it, no array of NULLs sent
    params = {
        "tenant_id": [k[0] for k in keys],
        "service_call_id": [k[1] for k in keys],
        "resume": list(resume),
        "control_seq": [None if p is None else p.seq for p in positions] if known else None,
        "control_stored_at": [None if p is None else p.stored_at for p in positions] if known else None,
        "terms": terms,
    }
    async with conn.transaction():
        rows = await (await conn.execute(QUERIES["control_timers"], params)).fetchall()
    # A claimed occurrence's pause applies through its record; one held by a batch in flight waits.
    outcomes: dict[Key, Outcome] = {
        (t, s): "deferred" if claimed else "applied" if applied else "ignored"
        for t, s, applied, _, claimed in rows
    }
    return outcomes, min((due for _, _, _, due, _ in rows if due is not None), default=None)
