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

# Rows one statement of a tenant's pause or resume moves: each chunk is its own short transaction, so a
# tenant of 100,000 timers never holds their locks (and the claims and commands behind them) at once.
PAUSE_CHUNK = 5000
# Rows one step of a tenant's pause or resume moves at most ("partial": the bulk lane steps it
# again), so the other tenants' turns come after one chunk.
PAUSE_ROWS_PER_STEP = PAUSE_CHUNK


# Advisory locks one intake transaction holds at most (lock_tenants_shared): the pause fence's.
# They come from a shared lock table of max_locks_per_transaction x connections (6,400 entries on a
# default server); one per tenant, a batch of 1,000 tenants held 1,000 and a few replicas ran it out
# ("out of shared memory", issue 36). A batch of more tenants than this locks their slots instead:
# the tenants hashed into this many keys, each standing for every tenant hashed to it.
TENANT_LOCKS = 32


def intake_lock_keys(tenants: Iterable[str]) -> list[int]:
    """The transaction-level advisory lock keys intake holds shared while it writes these tenants'
    timers (lock_tenants_shared), sorted: each tenant's own key, or, for more than TENANT_LOCKS
    tenants, their slots' keys. Never more than TENANT_LOCKS, so the lock table holds every replica's.

    A tenant's pause or resume takes both its own key and its slot's exclusively (pause_lock_keys), so
    it waits for every intake transaction writing the tenant's timers, whichever keys that one holds.
    A slot only adds waiting: a pause waits for a large batch that holds its slot for other tenants
    (one intake transaction, milliseconds), never for anything else."""
    distinct = set(tenants)
    if len(distinct) <= TENANT_LOCKS:
        return sorted({_lock_key(t) for t in distinct})
    return sorted({_slot_key(t) for t in distinct})


def pause_lock_keys(tenant: str) -> list[int]:
    """The keys a tenant's pause or resume takes exclusively (lock_tenant): its own and its slot's,
    in ascending order like intake's. Every transaction takes its keys in that one order, so no two
    wait for each other in a cycle."""
    return sorted({_lock_key(tenant), _slot_key(tenant)})


def tenant_lock_keys(tenants: Iterable[str], purpose: bytes) -> list[int]:
    """Advisory lock keys of these tenants for another `purpose` than the pause fence, sorted (a
    fixed order to take them in): the quota's recount (b"timer-quota", Store.quota_view)."""
    return sorted({_lock_key(t, purpose) for t in tenants})


def _lock_key(tenant: str, purpose: bytes = b"timer-pause") -> int:
    """A tenant's own key, the one place it is derived. A collision (with another tenant's, or a
    slot's) only makes them wait for each other's flag change."""
    digest = hashlib.blake2b(tenant.encode(), digest_size=8, person=purpose).digest()
    return int.from_bytes(digest, "big", signed=True)


def _slot_key(tenant: str) -> int:
    """The key of a tenant's slot: 0 to TENANT_LOCKS - 1 (the migration's session lock is far above)."""
    return _lock_key(tenant) % TENANT_LOCKS


async def pause(
    conn: psycopg.AsyncConnection[Any],
    command: PauseTimers,
    position: Position | None,
    stuck_after: timedelta,
) -> Applied:
    """Store.pause on one connection: the tenant's flag, then its rows chunk by chunk, each chunk its
    own transaction; or the one timer's row."""
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
        # Waits for every intake transaction writing this tenant's timers to end: their upserts read
        # the flag before this commits, so their rows must be committed, and visible, before the
        # rows are moved below. Every upsert after this commit reads the new flag.
        await conn.execute(QUERIES["lock_tenant"], {"keys": pause_lock_keys(command.tenant_id)})
        await conn.execute(QUERIES["pause_tenant"], flip)
    dues, more = await _move_rows(conn, command)
    if more:
        return Applied(["partial"], min(dues, default=None))
    left, claimed, stuck = await _left(conn, command, stuck_after)
    if left > claimed:
        # Rows no lease holds, left behind by a mark or a command that held them as the chunks
        # passed (a mark that read the flag just before it was set stores its next occurrence
        # Scheduled): once more, now, rather than a lease later, while the timer keeps firing.
        dues += (await _move_rows(conn, command))[0]
        left, claimed, stuck = await _left(conn, command, stuck_after)
    # Claimed ones fire first (their mark honours the flag); it is offered again for any other.
    # Only rows stuck behind a claim left (TIMER_STUCK_AFTER): given up, as a CancelTimer is.
    outcome: Outcome = "applied" if left == 0 else "stuck" if left == stuck else "deferred"
    return Applied([outcome], min(dues, default=None))


async def _move_rows(conn: psycopg.AsyncConnection[Any], command: PauseTimers) -> tuple[list[Any], bool]:
    """Move up to PAUSE_ROWS_PER_STEP of the tenant's rows: (their dueAts on resume, whether
    more may be left)."""
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
    """Rows the pause or resume left in the old state: (all, those claimed, those stuck behind a
    claim first taken longer than TIMER_STUCK_AFTER ago)."""
    left_query = QUERIES["tenant_left_paused" if command.resume else "tenant_left_scheduled"]
    params = {"tenant_id": command.tenant_id, "stuck_after": stuck_after}
    async with conn.transaction():
        found = await (await conn.execute(left_query, params)).fetchone()
    return (int(found[0]), int(found[1]), int(found[2])) if found else (0, 0, 0)


async def pause_timers(
    conn: psycopg.AsyncConnection[Any], commands: Sequence[PauseTimers], positions: Sequence[Position | None]
) -> Applied:
    """Timers' own pauses and resumes, any tenants', in one statement: the outcome of each, in order (a
    timer with no row: ignored). Each at its place in the stream (`positions`): one older than its timer's
    last pause or resume changes nothing, so a pause deferred behind a claim never undoes a later resume."""
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
    still carries `terms` (a bulk action's selector; None: any), in key order. Each in stream
    order as pause_timers'."""
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
    """control_timers, in a transaction of its own: the outcome of each key with a row (carrying
    `terms`), and the soonest dueAt a resume made claimable again."""
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
    # A claimed occurrence fires: with its lease committed, a pause records paused_at (applied) and
    # the mark stores the next one Paused; held by a claim's batch in flight, the pause or resume
    # waits for it (offered again). A resume's dueAt: when it made the timer claimable again.
    outcomes: dict[Key, Outcome] = {
        (t, s): "deferred" if claimed else "applied" if applied else "ignored"
        for t, s, applied, _, claimed in rows
    }
    return outcomes, min((due for _, _, _, due, _ in rows if due is not None), default=None)
