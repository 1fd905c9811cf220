"""One claim's transaction, held from the claim to the mark (Store.claim returns it)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.adapters.queries import QUERIES
from worker.core.domain import Claimed, ClaimParams, ClaimResult, Failed, Fired, Leased
from worker.errors import DatabaseError, TransientError


class Batch:
    """One claim's transaction (ports.ClaimedBatch): its connection, out of the pool until the
    batch ends.

    Held across the publish, so a replica holds up to PIPELINE_DEPTH + 1 (the fresh lane) while
    it fires; the pool is sized for that (Settings.db_pool_size). The session's
    idle_in_transaction_session_timeout (the lease, adapters/db.py) ends a batch whose replica
    froze: Postgres rolls it back, and another replica claims its rows.

    The claim wrote its one-shot occurrences as already recorded (`recorded`, their row ids:
    sql/queries.sql, claim_due), so the batch commits as it stands only once each of those was
    acknowledged. Otherwise it rolls the claim back, which undoes every row exactly, and records
    each row again by key, in its own statement, as the claim and its mark would have: acknowledged
    ones as fired (mark_fired_again), the rest leased (release_again). Between the two, for a
    moment, another claim may take a row: it publishes again under the same Nats-Msg-Id
    (deduplicated), and the statement after leaves that row alone."""

    __slots__ = ("_claim", "_conn", "_db", "_pool", "_recorded", "result")

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        db: Callable[..., AbstractContextManager[None]],
        conn: psycopg.AsyncConnection[Any] | None,
        result: ClaimResult,
        recorded: frozenset[str],
        claim: ClaimParams,
    ) -> None:
        self._pool = pool
        self._db = db  # Store._db: psycopg's errors as the store's (pgerrors.classify)
        self._conn = conn  # None once ended, or when the claim took nothing
        self.result = result
        self._recorded = recorded  # row ids of the occurrences the claim recorded as fired
        self._claim = claim  # what the claim asked for: its owner and lease, for release_again

    async def record(self, fired: Sequence[Fired], failed: Sequence[Failed]) -> int:
        """Mark what was acknowledged, release what failed, and commit them with the claim: one
        round trip. Raises (TransientError, DatabaseError) when the transaction is gone; then
        nothing of this batch, its claim included, is committed."""
        conn = self._conn
        if conn is None:
            raise TransientError("the batch already ended")
        self._conn = None
        recorded = self._recorded
        if recorded and not recorded.issubset(f.timer.row_id for f in fired):
            return await self._roll_back_and_record(conn, fired, failed)
        marks = None
        leased = [f for f in fired if f.timer.row_id not in recorded] if recorded else fired
        try:
            with self._db(write=True):
                async with conn.pipeline():
                    if leased:
                        marks = conn.cursor()
                        await marks.execute(QUERIES["mark_fired"], mark_params(leased))
                    if failed:
                        await conn.execute(QUERIES["retry_later"], _retry_params(failed))
                    await conn.execute("COMMIT")
        finally:
            await self._pool.putconn(conn)  # still in the transaction after an error: the pool rolls back
        return len(fired) - len(leased) + (0 if marks is None else marks.rowcount)

    async def close(self) -> None:
        """End a batch that was not recorded (a stop, an error): commit its claim (or, where it
        recorded occurrences, roll it back and lease each row again), so its occurrences stay
        claimed until the lease runs out, and return the connection."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._recorded:  # nothing acknowledged may be committed as fired: each row leased again
            # The session gone (or the statement refused): the claim is rolled back, its rows free.
            with contextlib.suppress(TransientError, DatabaseError):
                await self._roll_back_and_record(conn, [], [], lease=True)
            return
        try:
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                await conn.execute("COMMIT")
        except psycopg.Error:
            pass  # the session is gone, and the claim with it: its rows are free again
        finally:
            await self._pool.putconn(conn)

    async def _roll_back_and_record(
        self,
        conn: psycopg.AsyncConnection[Any],
        fired: Sequence[Fired],
        failed: Sequence[Failed],
        lease: bool = False,
    ) -> int:
        """Roll the claim back, then mark `fired` and release `failed` by key (with `lease`: every
        claimed row leased to this claim's owner, as a stop leaves them)."""
        claim = self._claim
        if lease:
            held: list[Leased] = [*self.result.claimed, *self.result.unreadable]
            release = release_params(held, [None] * len(held), [claim.lease_ms] * len(held), claim.owner)
        else:
            release = release_params(
                [c for c, _, _ in failed], [e[:500] for _, e, _ in failed], [b for *_, b in failed]
            )
        marks = None
        try:
            with self._db(write=True):
                async with conn.pipeline():
                    await conn.execute("ROLLBACK")
                    if fired:
                        marks = conn.cursor()
                        await marks.execute(QUERIES["mark_fired_again"], mark_again_params(fired))
                    if release["tenant_id"]:
                        await conn.execute(QUERIES["release_again"], release)
        finally:
            await self._pool.putconn(conn)
        return 0 if marks is None else marks.rowcount


def mark_params(fired: Sequence[Fired]) -> dict[str, Any]:
    params: dict[str, Any] = {
        "row_id": [f.timer.row_id for f in fired],
        "lease_token": [f.timer.lease_token for f in fired],
        "due_at": [f.timer.due_at for f in fired],
    }
    # A NULL array is padded with NULLs by unnest: one-shot timers need not send two arrays
    # of NULLs (dumping arrays is most of a mark's cost on this side).
    recurring = any(f.next_due_at is not None for f in fired)
    params["next_due_at"] = [f.next_due_at for f in fired] if recurring else None
    params["next_index"] = [f.next_index for f in fired] if recurring else None
    return params


def mark_again_params(fired: Sequence[Fired]) -> dict[str, Any]:
    """mark_fired_again's: each firing's key, its occurrence and definition (the guard), and what
    to mark. A column NULL in every row is sent as one NULL (unnest pads it): most timers repeat
    nothing."""
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
    }


def release_params(
    held: Sequence[Leased], errors: Sequence[str | None], holds_ms: Sequence[int], owner: str | None = None
) -> dict[str, Any]:
    """release_again's: each occurrence's key, its occurrence where it could be read (an unreadable
    dueAt is matched by key alone), what its claim wrote, and the error and time to hold it."""
    due_at, index = zip(*(_occurrence(h) for h in held), strict=True) if held else ((), ())
    return {
        "tenant_id": [h.tenant_id for h in held],
        "service_call_id": [h.service_call_id for h in held],
        "due_at": list(due_at),
        "occurrence_index": list(index),
        "recurrence_ref": [h.recurrence_ref for h in held],
        "lease_token": [h.lease_token for h in held],
        "attempts": [h.attempts for h in held],
        "error": list(errors),
        "hold_ms": list(holds_ms),
        "owner": owner,
    }


def _occurrence(held: Leased) -> tuple[datetime | None, int | None]:
    return (held.due_at, held.occurrence_index) if isinstance(held, Claimed) else (None, None)


def _retry_params(failed: Sequence[Failed]) -> dict[str, Any]:
    """(occurrence, error, back-off ms) each."""
    return {
        "row_id": [c.row_id for c, _, _ in failed],
        "lease_token": [c.lease_token for c, _, _ in failed],
        "error": [e[:500] for _, e, _ in failed],
        "backoff_ms": [b for _, _, b in failed],
    }
