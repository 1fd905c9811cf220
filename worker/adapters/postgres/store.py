"""Every database call of a replica but the claim's (claim.py): intake writes, pauses, reads, quota."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Collection, Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row
from psycopg_pool import AsyncConnectionPool

from worker.adapters.postgres import bulk, claim, pausing
from worker.adapters.postgres.claim import decide_params, record_again_params
from worker.adapters.postgres.columns import schedule_columns
from worker.adapters.postgres.pgerrors import classify
from worker.adapters.postgres.pinger import Pinger
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.writes import Writes
from worker.contract import CancelTimer, Command, MessageIds, PauseTimers, ScheduleTimer
from worker.core.domain import LOOKAHEAD_MS, Applied, BulkAction, Claimed, ClaimParams, Fired, Key, Position
from worker.core.ordering import Held, Marker, StreamOrder
from worker.core.ports import ClaimedBatch
from worker.core.timers import StoredTimer
from worker.errors import TransientError

log = logging.getLogger(__name__)

# How long a command waiting for an unclaimed timer may hold up later ones: a lease and an ack wait.
ORDER_GRACE = timedelta(minutes=1)
# How far ahead of the database clock a claim takes occurrences (claim_due's ahead_ms).
CLAIM_REACH = timedelta(milliseconds=LOOKAHEAD_MS)
# Past this many rows of a tenant in tenant_pending, the quota read folds them into one.
FOLD_AFTER = 8
FOLD_LIMIT = 100_000  # rows one fold takes at most (FOLD_AFTER and more per spread tenant of a batch)
RECOUNT_LOCKS = b"timer-quota"  # the advisory lock keys of a tenant's recount (lock_quota_recount)
FOLD_LOCK = pausing.tenant_lock_keys([""], b"timer-fold")[0]  # the fleet's one fold at a time


def _held(row: dict[str, Any]) -> Held:
    return Held(row["claimed"], row["stuck"], row["head"], row["marked"], row["due_at"])


def _columns(rows: Sequence[Any], *names: str) -> dict[str, list[Any]]:
    return {n: [getattr(r, n) for r in rows] for n in names}


class Store:
    """The Postgres adapter: every error it raises is a TransientError or a DatabaseError (classify)."""

    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        stuck_after: timedelta = timedelta(hours=1),
        order_grace: timedelta = ORDER_GRACE,
    ) -> None:
        self.pool = pool
        self.stuck_after = stuck_after
        self.order_grace = order_grace
        self._folding: asyncio.Task[None] | None = None  # pending_bounds' fold in flight, if any
        # The last write's error until one succeeds: a read-only database still answers `SELECT 1`.
        self.write_failure: str | None = None
        self.writes = Writes()  # readiness: a write stuck (a synchronous standby gone) says so
        self._pinger = Pinger.beside(pool)
        # The fleet's keyed ids, once the fleet secret is read (Service.connect).
        self.ids: MessageIds | None = None

    @contextlib.contextmanager
    def _db(self, write: bool = False) -> Iterator[None]:
        try:
            yield
        except psycopg.Error as exc:
            error = classify(exc)
            if write and isinstance(error, TransientError):  # named, not quoted: /readyz shows it
                self.write_failure = type(exc).__name__ + (f" ({exc.sqlstate})" if exc.sqlstate else "")
            raise error from exc
        if write:
            self.write_failure = None

    async def apply(
        self, commands: Sequence[Command], positions: Sequence[Position] | None = None
    ) -> Applied:
        """Apply commands in one transaction, each timer's in stream order (`positions`): each one's
        outcome, in order, and the soonest dueAt of the timers it left claimable (domain.Applied)."""
        where: Sequence[Position | None] = positions if positions is not None else [None] * len(commands)
        placed = list(zip(commands, where, strict=True))
        keys = [(c.tenant_id, c.service_call_id) for c in commands]
        dues: list[datetime] = []
        with self._db(write=True):
            async with self.pool.connection() as conn, _writing(self.writes), conn.transaction():
                # First, before any row lock: a pause or resume of these tenants waits for this.
                await _lock_tenants_shared(conn, commands)
                locked = await self._lock_keys(conn, set(keys))
                order = StreamOrder(keys, [None if p is None else p.seq for _, p in placed], locked)
                for indexes in order.rounds:
                    sent = order.to_send(indexes)
                    changed = await self._apply_round(conn, [placed[i] for i in sent])
                    dues += [d for d in changed.values() if d is not None]
                    held = await self._held_among(conn, order.unchanged(sent, changed))
                    dues += [h.due_at for h in held.values() if h.due_at is not None]
                    if markers := order.decide(indexes, sent, changed, held):
                        await self._update_deferred_seqs(conn, markers)
        return Applied(order.outcomes, min(dues, default=None))

    async def _apply_round(
        self, conn: psycopg.AsyncConnection[Any], batch: list[tuple[Command, Position | None]]
    ) -> dict[Key, datetime | None]:
        """The keys the round changed, each with its dueAt if it is now Scheduled."""
        schedules = [(c, p) for c, p in batch if isinstance(c, ScheduleTimer)]
        cancels = [(c, p) for c, p in batch if isinstance(c, CancelTimer)]
        changed: dict[Key, datetime | None] = {}

        def position_of(params: dict[str, Any], chosen: Sequence[Position | None]) -> None:
            # NULL (no order to keep) when unknown: an array of NULLs need not be sent.
            known = any(p is not None for p in chosen)
            params["command_seq"] = [None if p is None else p.seq for p in chosen] if known else None
            params["command_stored_at"] = (
                [None if p is None else p.stored_at for p in chosen] if known else None
            )

        if schedules:
            sched = [c for c, _ in schedules if isinstance(c, ScheduleTimer)]
            params = schedule_columns(sched, self.ids) | {"order_grace": self.order_grace}
            position_of(params, [p for _, p in schedules])
            cur = await conn.execute(QUERIES["upsert_schedules"], params)
            changed |= {(t, s): d for t, s, d in await cur.fetchall()}
        if cancels:
            cancel_params: dict[str, Any] = _columns(
                [c for c, _ in cancels], "tenant_id", "service_call_id", "correlation_id", "timestamp_ms"
            )
            cancel_params["command_ts"] = cancel_params.pop("timestamp_ms")
            position_of(cancel_params, [p for _, p in cancels])
            cancel_params["order_grace"] = self.order_grace
            cur = await conn.execute(QUERIES["cancel_timers"], cancel_params)
            changed |= {(t, s): d for t, s, d in await cur.fetchall()}
        return changed

    async def _lock_keys(self, conn: psycopg.AsyncConnection[Any], keys: set[Key]) -> dict[Key, bool]:
        """Lock the existing rows of `keys`; those another holds, each with whether a claim may."""
        params = {"tenant_id": [k[0] for k in keys], "service_call_id": [k[1] for k in keys]}
        cur = await conn.execute(QUERIES["lock_keys"], params | {"reach": CLAIM_REACH})
        return {(t, s): claimable for t, s, claimable in await cur.fetchall()}

    async def _held_among(self, conn: psycopg.AsyncConnection[Any], keys: list[Key]) -> dict[Key, Held]:
        if not keys:
            return {}
        cur = conn.cursor(row_factory=dict_row)
        await cur.execute(
            QUERIES["held_among"],
            {
                "tenant_id": [k[0] for k in keys],
                "service_call_id": [k[1] for k in keys],
                "stuck_after": self.stuck_after,
                "order_grace": self.order_grace,
            },
        )
        return {(r["tenant_id"], r["service_call_id"]): _held(r) for r in await cur.fetchall()}

    async def _update_deferred_seqs(self, conn: psycopg.AsyncConnection[Any], markers: list[Marker]) -> None:
        await conn.execute(
            QUERIES["update_deferred_seqs"],
            {
                "tenant_id": [m.key[0] for m in markers],
                "service_call_id": [m.key[1] for m in markers],
                "seq": [m.seq for m in markers],
                "waits": [m.waits for m in markers],
                "order_grace": self.order_grace,
            },
        )

    async def claim(self, params: ClaimParams) -> ClaimedBatch:
        """Claim up to `params.limit` occurrences (claim.claim)."""
        return await claim.claim(self.pool, self._db, params, self.writes)

    async def record_again(self, fired: Sequence[Fired]) -> int:
        """Record acknowledged firings whose batch's transaction was lost, committed on their own."""
        return await self._execute_count("record_fired_again", record_again_params(fired))

    async def decide_expiry(self, due: Sequence[Claimed], expired: Collection[Key]) -> set[Key]:
        """Each occurrence's expiry decision, the first one made standing, committed on its own."""
        with self._db(write=True):
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES["decide_expiry"], decide_params(due, expired))
                return {(r[0], r[1]) for r in await cur.fetchall() if r[2]}

    async def _execute_count(self, name: str, params: dict[str, Any]) -> int:
        with self._db(write=True):
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES[name], params)
                count: int = cur.rowcount
                return count

    async def get_many(self, tenant_id: str, service_call_ids: Sequence[str]) -> dict[str, StoredTimer]:
        with self._db():
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=class_row(StoredTimer))  # by column name
                await cur.execute(
                    QUERIES["get_timers"],
                    {"tenant_id": tenant_id, "service_call_ids": list(service_call_ids)},
                )
                return {timer.service_call_id: timer async for timer in cur}

    async def fleet_gauges(self, cap: int) -> tuple[int, float | None, int]:
        """(overdue unclaimed, capped at `cap`; age of the oldest in seconds; Scheduled estimate)."""
        with self._db():
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(QUERIES["status_overdue"], {"cap": cap})
                overdue = await cur.fetchone() or {"overdue": 0, "oldest_overdue_s": None}
                await cur.execute(QUERIES["scheduled_estimate"])
                estimate = await cur.fetchone() or {"scheduled": 0}
        oldest = overdue["oldest_overdue_s"]
        age = float(oldest) if oldest is not None else None
        return int(overdue["overdue"]), age, int(estimate["scheduled"])

    async def paused_gauges(self, cap: int) -> tuple[int, int]:
        """(paused timers, capped at `cap`; tenants paused as a whole): through timers_paused."""
        with self._db():
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES["paused_gauges"], {"cap": cap})
                found = await cur.fetchone()
        return (int(found[0]), int(found[1])) if found else (0, 0)

    async def delete_finished(self, retention: timedelta, limit: int) -> int:
        """Delete up to `limit` Reached/Cancelled rows older than `retention`; how many went."""
        return await self._execute_count("delete_finished", {"retention": retention, "limit": limit})

    async def delete_decided(self, limit: int) -> int:
        """Delete up to `limit` expiry decisions whose occurrence is no longer pending; how many went."""
        return await self._execute_count("delete_decided", {"limit": limit})

    async def pending_bounds(self, tenants: Sequence[str]) -> dict[str, int]:
        """For the quota: a bound never below each tenant's pending timers (0 for none). A tenant
        spread over more than FOLD_AFTER rows is folded beside the batch, not before it."""
        with self._db():
            async with self.pool.connection() as conn:
                cur = await conn.execute(QUERIES["quota_bounds"], {"tenant_id": list(tenants)})
                counted = await cur.fetchall()
        spread = [tenant for tenant, _, deltas in counted if deltas > FOLD_AFTER]
        if spread and (self._folding is None or self._folding.done()):  # one at a time: never queued
            self._folding = asyncio.create_task(self._fold(spread))
        return dict.fromkeys(tenants, 0) | {tenant: int(bound) for tenant, bound, _ in counted}

    async def _fold(self, tenants: list[str]) -> None:
        """Fold these tenants' rows of tenant_pending; a failure only makes the next read larger."""
        try:
            with self._db(write=True):
                async with self.pool.connection() as conn:
                    await conn.execute(
                        QUERIES["compact_pending"],
                        {"tenant_id": tenants, "limit": FOLD_LIMIT, "lock": FOLD_LOCK},
                    )
        except Exception as exc:  # a task of its own: nobody else would hear of it
            log.warning("quota fold failed", extra={"action": "quota_fold_failed", "error": str(exc)})

    async def quota_view(
        self, keys: Sequence[Key], tenants: Sequence[str], cap: int
    ) -> tuple[set[Key], dict[str, int]]:
        """For the quota, exactly: the keys that exist as Scheduled, Paused or Reached, and each
        tenant's pending count capped at `cap`."""
        with self._db(write=True):
            async with self.pool.connection() as conn:
                cur = conn.cursor(row_factory=dict_row)
                await cur.execute(
                    QUERIES["quota_known_keys"],
                    {"tenant_id": [k[0] for k in keys], "service_call_id": [k[1] for k in keys]},
                )
                known = {(r["tenant_id"], r["service_call_id"]) for r in await cur.fetchall()}
                async with conn.transaction():
                    locks = {"keys": pausing.tenant_lock_keys(tenants, RECOUNT_LOCKS)}
                    await cur.execute(QUERIES["lock_quota_recount"], locks)
                    await cur.execute(QUERIES["quota_recount"], {"tenant_id": list(tenants), "cap": cap})
                    pending = {r["tenant_id"]: int(r["pending"]) for r in await cur.fetchall()}
        return known, pending

    async def compact_pending(self, limit: int) -> int:
        """Fold up to `limit` rows of tenant_pending, any tenant's; how many (none while another runs)."""
        with self._db(write=True):
            async with self.pool.connection() as conn:
                cur = await conn.execute(
                    QUERIES["compact_pending"], {"tenant_id": None, "limit": limit, "lock": FOLD_LOCK}
                )
                row = await cur.fetchone()
                return int(row[0]) if row else 0

    async def pause(self, command: PauseTimers, position: Position | None = None) -> Applied:
        """Pause or resume a tenant's timers, or one: its outcome and, for a resume, the soonest
        dueAt made claimable. Every step can run again, so a crash half-way loses nothing."""
        with self._db(write=True):
            async with self.pool.connection() as conn:
                return await pausing.pause(conn, command, position, self.stuck_after)

    async def pause_timers(
        self, commands: Sequence[PauseTimers], positions: Sequence[Position] | None = None
    ) -> Applied:
        """Timers' own pauses and resumes, each timer once, in one statement (pausing.pause_timers)."""
        where: Sequence[Position | None] = positions if positions is not None else [None] * len(commands)
        with self._db(write=True):
            async with self.pool.connection() as conn:
                return await pausing.pause_timers(conn, commands, where)

    async def select_labelled(
        self, action: BulkAction, position: Position | None, after: str, limit: int
    ) -> list[str]:
        """The next chunk of the timers a bulk action names (bulk.py)."""
        with self._db():
            async with self.pool.connection() as conn:
                return await bulk.select_labelled(conn, action, position, after, limit)

    async def pause_listed(
        self, action: BulkAction, service_call_ids: Sequence[str], position: Position | None
    ) -> Applied:
        """A bulk pause's or resume's chunk: each timer still carrying the selector, in one transaction."""
        terms = bulk.label_terms(action.tenant_id, action.selector)
        with self._db(write=True):
            async with self.pool.connection() as conn:
                return await pausing.pause_listed(
                    conn, action.tenant_id, service_call_ids, action.kind == "resume", position, terms
                )

    async def ping(self) -> None:
        """Whether Postgres answers within pinger.PING_TIMEOUT_S, on its own connection, not the pool's."""
        with self._db():
            await self._pinger.ping()

    async def close(self) -> None:
        await self._pinger.close()


async def _lock_tenants_shared(conn: psycopg.AsyncConnection[Any], commands: Sequence[Command]) -> None:
    """Hold the ScheduleTimers' tenants against a pause or resume until this transaction ends."""
    tenants = [c.tenant_id for c in commands if isinstance(c, ScheduleTimer)]
    if tenants:
        await conn.execute(QUERIES["lock_tenants_shared"], {"keys": pausing.intake_lock_keys(tenants)})


@contextlib.asynccontextmanager
async def _writing(writes: Writes) -> AsyncIterator[None]:
    """Writes.writing as an async context, left after the transaction's COMMIT has answered."""
    with writes.writing():
        yield
