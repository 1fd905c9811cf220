"""A claim (claim_due): its transaction, held from the claim to its record (Batch), its rows read by
column name, and the parameters of the statements that end it or record it again."""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.writes import Writes
from worker.core.domain import (
    CATCHUP_MAX,
    Claimed,
    ClaimParams,
    ClaimResult,
    Failed,
    Fired,
    Key,
    Leased,
    Unreadable,
)
from worker.errors import DatabaseError, TransientError

Db = Callable[..., AbstractContextManager[None]]  # Store._db: psycopg's errors as the store's


def claim_due_params(params: ClaimParams) -> dict[str, Any]:
    """claim_due's parameters for one claim."""
    return {
        "owner": params.owner,
        "ahead_ms": params.ahead_ms,
        "fresh_window_ms": params.fresh_window_ms,
        "oldest_limit": params.limit - params.fresh_limit,
        "fresh_limit": params.fresh_limit,
        "lease_ms": params.lease_ms,
        "downtime_ms": params.downtime_ms,
        "catchup_max": CATCHUP_MAX - 1,  # caught_up counts the ones fired before this one
    }


async def claim(pool: AsyncConnectionPool[Any], db: Db, params: ClaimParams, writes: Writes) -> Batch:
    """Claim up to `params.limit` occurrences in a transaction the batch keeps open until recorded
    or closed; a claim that took nothing holds no connection."""
    with db(write=True):
        conn = await pool.getconn()
        try:
            # BEGIN and the plan settings in one message, not pipelined: a session a pipeline left
            # in a transaction escaped idle_in_transaction_session_timeout.
            await conn.execute(QUERIES["claim_begin"])
            cur = conn.cursor(binary=True)  # plain tuples, read by column name (_ClaimReader)
            await cur.execute(QUERIES["claim_due"], claim_due_params(params))
            received = time.monotonic()  # the clock reading is in: the rows are read after
            rows = await cur.fetchall()
            names = [c.name for c in cur.description or ()]
            result = claim_result(names, rows, received)
            recorded = recorded_ids(names, rows)
            empty = not (result.claimed or result.unreadable)
            if empty:
                await conn.execute("COMMIT")
        except BaseException:
            await pool.putconn(conn)  # in a transaction or broken: the pool rolls back or drops it
            raise
    if empty:
        await pool.putconn(conn)
        return Batch(pool, db, None, result, recorded, params, writes)
    return Batch(pool, db, conn, result, recorded, params, writes)


class Batch:
    """One claim's transaction (ports.ClaimedBatch), its connection out of the pool until it ends.
    What the claim wrote as fired (`recorded`) commits so only if acknowledged."""

    __slots__ = ("_claim", "_conn", "_db", "_pool", "_recorded", "_writes", "result")

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        db: Db,
        conn: psycopg.AsyncConnection[Any] | None,
        result: ClaimResult,
        recorded: frozenset[str],
        claim: ClaimParams,
        writes: Writes,
    ) -> None:
        self._pool = pool
        self._db = db  # Store._db: psycopg's errors as the store's (pgerrors.classify)
        self._conn = conn  # None once ended, or when the claim took nothing
        self.result = result
        self._recorded = recorded  # row ids of the occurrences the claim recorded as fired
        self._claim = claim  # what the claim asked for: its owner and lease, for a stop's hold
        self._writes = writes  # Store.writes: the commit below, in flight, for readiness

    async def record(self, fired: Sequence[Fired], failed: Sequence[Failed]) -> int:
        """Record what was acknowledged, release what failed, commit both with the claim in one
        round trip. Raises when the transaction is gone; then nothing of the batch is committed."""
        conn = self._conn
        if conn is None:
            raise TransientError("the batch already ended")
        self._conn = None
        recorded = self._recorded
        leased = [f for f in fired if f.timer.row_id not in recorded] if recorded else fired
        release: list[tuple[Leased, str | None, int]] = list(failed)
        if len(fired) - len(leased) < len(recorded):
            # Recorded as fired but neither fired nor failed: held for a lease, never committed unpublished.
            ended = {f.timer.row_id for f in fired} | {c.row_id for c, _, _ in failed}
            release += [(h, None, self._claim.lease_ms) for h in self._recorded_among(ended)]
        records = None
        try:
            with self._db(write=True), self._writes.writing():
                async with conn.pipeline():
                    if leased:
                        records = conn.cursor()
                        await records.execute(QUERIES["record_fired"], record_params(leased))
                    if release:
                        await conn.execute(QUERIES["retry_later"], retry_params(release))
                    await conn.execute("COMMIT")
        finally:
            await self._pool.putconn(conn)  # still in the transaction after an error: the pool rolls back
        return len(fired) - len(leased) + (0 if records is None else records.rowcount)

    async def close(self) -> None:
        """End a batch not recorded (a stop, an error): commit its claim, what it recorded as fired
        put back leased, and return the connection."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        claim = self._claim
        try:
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                with self._writes.writing():
                    async with conn.pipeline():
                        if held := self._recorded_among(frozenset()):
                            hold = [(h, None, claim.lease_ms) for h in held]
                            await conn.execute(QUERIES["retry_later"], retry_params(hold, claim.owner))
                        await conn.execute("COMMIT")
        except psycopg.Error:
            pass  # the session is gone, and the claim with it: its rows are free again
        finally:
            await self._pool.putconn(conn)

    def _recorded_among(self, ended: Collection[str]) -> list[Leased]:
        """The claim's occurrences it recorded as fired, but those in `ended` (row ids)."""
        recorded = self._recorded
        rows: list[Leased] = [*self.result.claimed, *self.result.unreadable]
        return [r for r in rows if r.row_id in recorded and r.row_id not in ended]


def record_params(fired: Sequence[Fired]) -> dict[str, Any]:
    params: dict[str, Any] = {
        "row_id": [f.timer.row_id for f in fired],
        "lease_token": [f.timer.lease_token for f in fired],
        "due_at": [f.timer.due_at for f in fired],
    }
    # unnest pads a NULL array with NULLs: one-shot timers send no arrays of NULLs.
    recurring = any(f.next_due_at is not None for f in fired)
    params["next_due_at"] = [f.next_due_at for f in fired] if recurring else None
    params["next_index"] = [f.next_index for f in fired] if recurring else None
    windowed = any(f.next_nominal is not None for f in fired)  # few timers have a firing window
    params["next_nominal"] = [f.next_nominal for f in fired] if windowed else None
    params["unfired"] = _unfired(fired)
    return params


def _unfired(fired: Sequence[Fired]) -> list[bool] | None:
    """Which firings were not fired (expired, skipped); None when none."""
    return [f.unfired for f in fired] if any(f.unfired for f in fired) else None


def record_again_params(fired: Sequence[Fired]) -> dict[str, Any]:
    """record_fired_again's: each firing's key, occurrence and definition (the guard), what to record."""
    timers = [f.timer for f in fired]

    def column(values: list[Any]) -> list[Any] | None:
        return values if any(v is not None for v in values) else None

    return {
        "tenant_id": [t.tenant_id for t in timers],
        "service_call_id": [t.service_call_id for t in timers],
        "due_at": [t.due_at for t in timers],
        "occurrence_index": [t.occurrence_index for t in timers],
        "recurrence_ref": [t.recurrence_ref for t in timers],
        "anchor_due_at": column([t.anchor_due_at for t in timers]),
        "repeat_every": column([t.repeat_every for t in timers]),
        "repeat_times": column([t.repeat_times for t in timers]),
        "repeat_timezone": column([t.repeat_timezone for t in timers]),
        "repeat_cron": column([t.repeat_cron for t in timers]),
        "repeat_until": column([t.repeat_until for t in timers]),
        "next_due_at": column([f.next_due_at for f in fired]),
        "next_index": column([f.next_index for f in fired]),
        "attempts": [t.attempts for t in timers],  # what a one-shot occurrence keeps (CONTRACT.md)
        "next_nominal": column([f.next_nominal for f in fired]),
        "fire_window": column([t.fire_window for t in timers]),
        "unfired": _unfired(fired),
    }


def decide_params(due: Sequence[Claimed], expired: Collection[Key]) -> dict[str, Any]:
    """decide_expiry's: each occurrence by its event id's parts, and whether it expires."""
    return {
        "tenant_id": [c.tenant_id for c in due],
        "service_call_id": [c.service_call_id for c in due],
        "due_at": [c.due_at if c.nominal_due_at is None else c.nominal_due_at for c in due],
        "expired": [(c.tenant_id, c.service_call_id) in expired for c in due],
    }


def retry_params(held: Sequence[tuple[Leased, str | None, int]], owner: str | None = None) -> dict[str, Any]:
    """retry_later's: (occurrence, error or None, ms to hold it) each, and the lease's owner."""
    return {
        "row_id": [h.row_id for h, _, _ in held],
        "lease_token": [h.lease_token for h, _, _ in held],
        "error": [None if e is None else e[:500] for _, e, _ in held],
        "backoff_ms": [ms for _, _, ms in held],
        "owner": owner,
    }


@dataclass(frozen=True, slots=True)
class _ClaimReader:
    """Where claim_due's columns are, found once per shape: rows are plain tuples (cheaper than a
    row class), and a missing column fails the claim."""

    claimed: Callable[[Sequence[Any]], tuple[Any, ...]]  # Claimed's fields, in its order
    unreadable: Callable[[Sequence[Any]], tuple[Any, ...]]  # Unreadable's
    tenant_id: int
    due_at: int
    next_due_at: int
    db_now: int
    row_id: int
    recorded: int  # the claim wrote the occurrence as fired (claim_due)


@functools.lru_cache(maxsize=4)
def _reader_for(names: tuple[str, ...]) -> _ClaimReader:
    where = {n: i for i, n in enumerate(names)}
    missing = [f for f in (*Claimed._fields, "next_due_at", "db_now", "recorded") if f not in where]
    if missing:
        raise DatabaseError(f"claim_due returns no column {', '.join(missing)} (sql/queries/)")
    return _ClaimReader(
        claimed=operator.itemgetter(*(where[f] for f in Claimed._fields)),
        unreadable=operator.itemgetter(*(where[f] for f in Unreadable._fields)),
        tenant_id=where["tenant_id"],
        due_at=where["due_at"],
        next_due_at=where["next_due_at"],
        db_now=where["db_now"],
        row_id=where["row_id"],
        recorded=where["recorded"],
    )


def claim_result(
    names: Sequence[str], rows: Sequence[Sequence[Any]], received: float | None = None
) -> ClaimResult:
    """claim_due's rows, read by column name (`received`: their arrival, time.monotonic)."""
    read = _reader_for(tuple(names))
    # The one row of a claim that took nothing has NULL in every timer column.
    key, due_at = read.tenant_id, read.due_at
    taken = [r for r in rows if r[key] is not None]
    db_now = max(r[read.db_now] for r in rows)  # the latest reading of the clock
    next_due_at = rows[0][read.next_due_at]  # the same on every row
    return ClaimResult(
        claimed=[Claimed._make(read.claimed(r)) for r in taken if r[due_at] is not None],
        unreadable=[Unreadable._make(read.unreadable(r)) for r in taken if r[due_at] is None],
        next_due_in_ms=None if next_due_at is None else (next_due_at - db_now).total_seconds() * 1000,
        db_now=db_now,
        received=received,
    )


def recorded_ids(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> frozenset[str]:
    """The row ids of the occurrences claim_due recorded as fired (its `recorded` column)."""
    read = _reader_for(tuple(names))
    flag, row_id = read.recorded, read.row_id
    return frozenset(r[row_id] for r in rows if r[flag])
