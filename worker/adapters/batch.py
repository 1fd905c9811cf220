"""One claim's transaction, held from the claim to the mark (Store.claim returns it)."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.adapters.queries import QUERIES
from worker.adapters.writes import Writes
from worker.core.domain import ClaimParams, ClaimResult, Failed, Fired, Leased
from worker.errors import TransientError


class Batch:
    """One claim's transaction (ports.ClaimedBatch): its connection, out of the pool until the
    batch ends.

    Held across the publish, so a replica holds up to PIPELINE_DEPTH + 1 (the fresh lane) while
    it fires; the pool is sized for that (Settings.db_pool_size). The session's
    idle_in_transaction_session_timeout (the lease, adapters/db.py) ends a batch whose replica
    froze: Postgres rolls it back, and another replica claims its rows.

    The claim wrote some one-shot occurrences as already fired (`recorded`, their row ids:
    sql/queries.sql, claim_due); the batch commits that only for those acknowledged, and puts
    each other one back, leased, in the same transaction (retry_later): until it commits, nobody
    sees any of its rows otherwise than as the claim found them."""

    __slots__ = ("_claim", "_conn", "_db", "_pool", "_recorded", "_writes", "result")

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        db: Callable[..., AbstractContextManager[None]],
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
        """Mark what was acknowledged, release what failed, and commit them with the claim: one
        round trip. Raises (TransientError, DatabaseError) when the transaction is gone; then
        nothing of this batch, its claim included, is committed."""
        conn = self._conn
        if conn is None:
            raise TransientError("the batch already ended")
        self._conn = None
        recorded = self._recorded
        leased = [f for f in fired if f.timer.row_id not in recorded] if recorded else fired
        release: list[tuple[Leased, str | None, int]] = list(failed)
        if len(fired) - len(leased) < len(recorded):
            # The firing loop ends each occurrence as fired or failed; one it recorded as neither
            # would commit as fired unpublished: held for a lease instead, whatever happened.
            ended = {f.timer.row_id for f in fired} | {c.row_id for c, _, _ in failed}
            release += [(h, None, self._claim.lease_ms) for h in self._recorded_among(ended)]
        marks = None
        try:
            with self._db(write=True), self._writes.writing():
                async with conn.pipeline():
                    if leased:
                        marks = conn.cursor()
                        await marks.execute(QUERIES["mark_fired"], mark_params(leased))
                    if release:
                        await conn.execute(QUERIES["retry_later"], retry_params(release))
                    await conn.execute("COMMIT")
        finally:
            await self._pool.putconn(conn)  # still in the transaction after an error: the pool rolls back
        return len(fired) - len(leased) + (0 if marks is None else marks.rowcount)

    async def close(self) -> None:
        """End a batch that was not recorded (a stop, an error): commit its claim, each occurrence
        it recorded as fired put back leased (retry_later, none may commit as fired
        unacknowledged), so they all stay claimed until the lease runs out; return the connection."""
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


def retry_params(held: Sequence[tuple[Leased, str | None, int]], owner: str | None = None) -> dict[str, Any]:
    """retry_later's: (occurrence, error or None to keep the row's, ms to hold it) each, and the
    lease's owner (None: any replica's after the back-off)."""
    return {
        "row_id": [h.row_id for h, _, _ in held],
        "lease_token": [h.lease_token for h, _, _ in held],
        "error": [None if e is None else e[:500] for _, e, _ in held],
        "backoff_ms": [ms for _, _, ms in held],
        "owner": owner,
    }
