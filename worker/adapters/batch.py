"""One claim's transaction, held from the claim to the mark (Store.claim returns it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.adapters.queries import QUERIES
from worker.core.domain import ClaimResult, Failed, Fired
from worker.errors import TransientError


class Batch:
    """One claim's transaction (ports.ClaimedBatch): its connection, out of the pool until the
    batch ends.

    Held across the publish, so a replica holds up to PIPELINE_DEPTH + 1 (the fresh lane) while
    it fires; the pool is sized for that (Settings.db_pool_size). The session's
    idle_in_transaction_session_timeout (the lease, adapters/db.py) ends a batch whose replica
    froze: Postgres rolls it back, and another replica claims its rows."""

    __slots__ = ("_conn", "_db", "_pool", "result")

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        db: Callable[..., AbstractContextManager[None]],
        conn: psycopg.AsyncConnection[Any] | None,
        result: ClaimResult,
    ) -> None:
        self._pool = pool
        self._db = db  # Store._db: psycopg's errors as the store's (pgerrors.classify)
        self._conn = conn  # None once ended, or when the claim took nothing
        self.result = result

    async def record(self, fired: Sequence[Fired], failed: Sequence[Failed]) -> int:
        """Mark what was acknowledged, release what failed, and commit them with the claim: one
        round trip. Raises (TransientError, DatabaseError) when the transaction is gone; then
        nothing of this batch, its claim included, is committed."""
        conn = self._conn
        if conn is None:
            raise TransientError("the batch already ended")
        self._conn = None
        marks = None
        try:
            with self._db(write=True):
                async with conn.pipeline():
                    if fired:
                        marks = conn.cursor()
                        await marks.execute(QUERIES["mark_fired"], mark_params(fired))
                    if failed:
                        await conn.execute(QUERIES["retry_later"], _retry_params(failed))
                    await conn.execute("COMMIT")
        finally:
            await self._pool.putconn(conn)  # still in the transaction after an error: the pool rolls back
        return 0 if marks is None else marks.rowcount

    async def close(self) -> None:
        """End a batch that was not recorded (a stop, an error): commit its claim, so its
        occurrences stay claimed until the lease runs out, and return the connection."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
                await conn.execute("COMMIT")
        except psycopg.Error:
            pass  # the session is gone, and the claim with it: its rows are free again
        finally:
            await self._pool.putconn(conn)


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
    }


def _retry_params(failed: Sequence[Failed]) -> dict[str, Any]:
    """(occurrence, error, back-off ms) each."""
    return {
        "row_id": [c.row_id for c, _, _ in failed],
        "lease_token": [c.lease_token for c, _, _ in failed],
        "error": [e[:500] for _, e, _ in failed],
        "backoff_ms": [b for _, _, b in failed],
    }
