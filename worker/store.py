"""Every database operation of a replica: intake writes, claims, fenced marks, reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from worker.commands import CancelTimer, Command, ScheduleTimer
from worker.errors import TransientError
from worker.queries import QUERIES

Outcome = Literal["applied", "ignored", "deferred"]
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Claimed:
    """One claimed occurrence: what to publish, and the fence to mark it with."""

    tenant_id: str
    service_call_id: str
    due_at: datetime
    correlation_id: str | None
    lease_token: int
    attempts: int
    repeat_every: str | None
    repeat_times: int | None
    repeat_timezone: str | None
    anchor_due_at: datetime | None
    occurrence_index: int
    claimed_at: datetime  # a recurring timer's next occurrence comes after this (claim_due says which)


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claimed: list[Claimed]
    next_due_in_ms: float | None  # until the next occurrence beyond the claim's reach
    db_now: datetime  # the database clock at the end of the claim


@dataclass(frozen=True, slots=True)
class Fired:
    """A published occurrence to record, with the next one for a recurring timer."""

    timer: Claimed
    next_due_at: datetime | None
    next_index: int | None


def _rounds(commands: Sequence[Command]) -> list[list[int]]:
    """Split a batch into rounds in which each key appears once, keeping stream order per key.

    One INSERT ... ON CONFLICT cannot touch a row twice, and applying a key's commands in
    order, round after round, is exactly applying them one by one.
    """
    seen: dict[Key, int] = {}
    rounds: list[list[int]] = []
    for i, c in enumerate(commands):
        key = (c.tenant_id, c.service_call_id)
        r = seen.get(key, 0)
        seen[key] = r + 1
        if r == len(rounds):
            rounds.append([])
        rounds[r].append(i)
    return rounds


def _columns(rows: Sequence[Any], *names: str) -> dict[str, list[Any]]:
    return {n: [getattr(r, n) for r in rows] for n in names}


class Store:
    """The Postgres adapter. Every statement is named in sql/queries.sql."""

    def __init__(self, pool: AsyncConnectionPool[Any]) -> None:
        self.pool = pool

    async def apply(self, commands: Sequence[Command]) -> list[Outcome]:
        """Apply a batch of commands in one transaction; the outcome of each, in order."""
        outcomes: list[Outcome] = ["ignored"] * len(commands)
        deferred: set[Key] = set()
        try:
            async with self.pool.connection() as conn, conn.transaction():
                for indexes in _rounds(commands):
                    todo = [i for i in indexes if _key(commands[i]) not in deferred]
                    changed = await self._apply_round(conn, [commands[i] for i in todo])
                    untouched = [_key(commands[i]) for i in todo if _key(commands[i]) not in changed]
                    if untouched:
                        deferred |= await self._claimed_among(conn, untouched)
                    for i in todo:
                        if _key(commands[i]) in changed:
                            outcomes[i] = "applied"
                    for i in indexes:
                        if _key(commands[i]) in deferred:
                            outcomes[i] = "deferred"
        except psycopg.OperationalError as exc:
            raise TransientError(f"postgres: {exc}") from exc
        return outcomes

    async def _apply_round(self, conn: psycopg.AsyncConnection[Any], batch: list[Command]) -> set[Key]:
        schedules = [c for c in batch if isinstance(c, ScheduleTimer)]
        cancels = [c for c in batch if isinstance(c, CancelTimer)]
        changed: set[Key] = set()
        if schedules:
            params = {
                "tenant_id": [c.tenant_id for c in schedules],
                "service_call_id": [c.service_call_id for c in schedules],
                "due_at": [c.due_at for c in schedules],
                "correlation_id": [c.correlation_id for c in schedules],
                "command_ts": [c.timestamp_ms for c in schedules],
                "repeat_every": [c.repeat.every if c.repeat else None for c in schedules],
                "repeat_times": [c.repeat.times if c.repeat else None for c in schedules],
                "repeat_timezone": [c.repeat.timezone if c.repeat else None for c in schedules],
            }
            cur = await conn.execute(QUERIES["upsert_schedules"], params)
            changed |= {(t, s) for t, s in await cur.fetchall()}
        if cancels:
            cancel_params = _columns(
                cancels, "tenant_id", "service_call_id", "correlation_id", "timestamp_ms"
            )
            cancel_params["command_ts"] = cancel_params.pop("timestamp_ms")
            cur = await conn.execute(QUERIES["cancel_timers"], cancel_params)
            changed |= {(t, s) for t, s in await cur.fetchall()}
        return changed

    async def _claimed_among(self, conn: psycopg.AsyncConnection[Any], keys: list[Key]) -> set[Key]:
        cur = await conn.execute(
            QUERIES["claimed_among"],
            {"tenant_id": [k[0] for k in keys], "service_call_id": [k[1] for k in keys]},
        )
        return {(t, s) for t, s in await cur.fetchall()}

    async def claim(
        self,
        owner: str,
        limit: int,
        fresh_limit: int,
        lease_ms: int,
        ahead_ms: int = 0,
        fresh_window_ms: int = 86_400_000,
        downtime_ms: int | None = None,
    ) -> ClaimResult:
        """Claim up to `limit` occurrences due within `ahead_ms`: the oldest, and `fresh_limit`
        of the most recent, due no longer than `fresh_window_ms` ago. A timer left claimable and
        unclaimed for `downtime_ms` (default: the lease) had no replica to claim it: downtime."""
        params = {
            "owner": owner,
            "ahead_ms": ahead_ms,
            "fresh_window_ms": fresh_window_ms,
            "oldest_limit": limit - fresh_limit,
            "fresh_limit": fresh_limit,
            "lease_ms": lease_ms,
            "downtime_ms": lease_ms if downtime_ms is None else downtime_ms,
        }
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES["claim_due"], params, binary=True)
                rows = await cur.fetchall()
        except psycopg.OperationalError as exc:
            raise TransientError(f"postgres: {exc}") from exc
        tail = rows[-1]  # the UNION ALL row with the next due time
        return ClaimResult(
            claimed=[Claimed(*r[:12]) for r in rows[:-1]],
            next_due_in_ms=tail[12],
            db_now=tail[13],
        )

    async def mark_fired(self, fired: Sequence[Fired]) -> int:
        """Record acknowledged firings; returns how many the fence let through."""
        if not fired:
            return 0
        params: dict[str, Any] = {
            "tenant_id": [f.timer.tenant_id for f in fired],
            "service_call_id": [f.timer.service_call_id for f in fired],
            "lease_token": [f.timer.lease_token for f in fired],
            "due_at": [f.timer.due_at for f in fired],
        }
        # A NULL array is padded with NULLs by unnest: one-shot timers need not send two arrays
        # of NULLs (dumping arrays is most of a mark's cost on this side).
        recurring = any(f.next_due_at is not None for f in fired)
        params["next_due_at"] = [f.next_due_at for f in fired] if recurring else None
        params["next_index"] = [f.next_index for f in fired] if recurring else None
        return await self._execute_count("mark_fired", params)

    async def retry_later(self, failed: Sequence[tuple[Claimed, str]], backoff_ms: int) -> int:
        if not failed:
            return 0
        params: dict[str, Any] = _columns(
            [c for c, _ in failed], "tenant_id", "service_call_id", "lease_token"
        )
        params["error"] = [e[:500] for _, e in failed]
        params["backoff_ms"] = backoff_ms
        return await self._execute_count("retry_later", params)

    async def _execute_count(self, name: str, params: dict[str, Any]) -> int:
        try:
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES[name], params)
                count: int = cur.rowcount
                return count
        except psycopg.OperationalError as exc:
            raise TransientError(f"postgres: {exc}") from exc

    async def get(self, tenant_id: str, service_call_id: str) -> dict[str, Any] | None:
        async with self.pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(
                QUERIES["get_timer"], {"tenant_id": tenant_id, "service_call_id": service_call_id}
            )
            row: dict[str, Any] | None = await cur.fetchone()
            return row

    async def fleet_gauges(self, cap: int) -> tuple[int, float | None, int]:
        """(overdue unclaimed, capped at `cap`; age of the oldest in seconds; Scheduled estimate)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(QUERIES["status_overdue"], {"cap": cap})
            overdue, oldest = await cur.fetchone() or (0, None)
            cur = await conn.execute(QUERIES["scheduled_estimate"])
            (scheduled,) = await cur.fetchone() or (0,)
        return int(overdue), (float(oldest) if oldest is not None else None), int(scheduled)

    async def ping(self) -> None:
        async with self.pool.connection(timeout=2) as conn:
            await conn.execute("SELECT 1")


def _key(c: Command) -> Key:
    return (c.tenant_id, c.service_call_id)


async def delete_finished(store: Store, retention: timedelta, limit: int) -> int:
    """Delete up to `limit` Reached/Cancelled rows older than `retention`; how many went."""
    return await store._execute_count("delete_finished", {"retention": retention, "limit": limit})


async def quota_view(
    store: Store, keys: Sequence[Key], tenants: Sequence[str], cap: int
) -> tuple[set[Key], dict[str, int]]:
    """For the quota: which keys already exist as Scheduled or Reached (a ScheduleTimer for them
    adds no pending timer), and each tenant's Scheduled count, capped at `cap`."""
    try:
        async with store.pool.connection() as conn:
            cur = await conn.execute(
                QUERIES["quota_known_keys"],
                {"tenant_id": [k[0] for k in keys], "service_call_id": [k[1] for k in keys]},
            )
            known = {(t, s) for t, s in await cur.fetchall()}
            cur = await conn.execute(
                QUERIES["quota_pending_counts"], {"tenant_id": list(tenants), "cap": cap}
            )
            pending = {t: int(n) for t, n in await cur.fetchall()}
    except psycopg.OperationalError as exc:
        raise TransientError(f"postgres: {exc}") from exc
    return known, pending
