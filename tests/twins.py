"""In-memory twins of the loops' ports (worker/core/ports.py) and a fake database clock, for unit tests.

Each twin does what its adapter does, as far as a loop can tell: tests/integration/
test_port_conformance.py runs the same checks against twin and adapter. A twin's database clock
is a plain number (FakeTime) that only moves when a test or a sleep moves it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors
from nats.aio.msg import Msg

from worker.adapters.jetstream import errors as nats_errors  # noqa: F401  # the real broker's verdict on nats-py's errors
from worker.contract import CancelTimer, Command, MessageIds, Outgoing, PauseTimers, ScheduleTimer, Subjects
from worker.core.domain import (
    Applied,
    BulkAction,
    Claimed,
    ClaimParams,
    ClaimResult,
    Failed,
    Fired,
    Key,
    Leased,
    Outcome,
    Position,
    Unreadable,
)
from worker.core.ordering import Held, StreamOrder
from worker.errors import TransientError


def event_id(message: Outgoing) -> str:
    """A DueTimeReached's envelope `id`, `<tenant>:<serviceCallId>:<dueAt ms>`: its Nats-Msg-Id
    is an HMAC of it (contract.MessageIds), which says nothing to a test."""
    return str(json.loads(message.payload)["id"])


@dataclass
class FakeTime:
    """The database clock, in epoch seconds: it moves only when told to (or a FakeClock sleeps)."""

    t: float = 1.8e9

    def __call__(self) -> float:
        return self.t

    def dt(self) -> datetime:
        return datetime.fromtimestamp(self.t, UTC)


class FakeClock:
    """The replica's estimate of the database clock (worker.core.clock.Clock) on FakeTime: `behind_s`
    behind it, as a real estimate may be. A sleep moves the time, waking up to `early_s` early,
    as an event loop's timer may: whoever sleeps must look at the clock again."""

    def __init__(self, time: FakeTime, behind_s: float = 0.0, early_s: float = 0.0) -> None:
        self.time, self.behind_s, self.early_s = time, behind_s, early_s
        self.readings: list[datetime] = []

    def observe(self, reading: datetime, received: float | None = None) -> None:
        self.readings.append(reading)

    def now(self) -> float:
        return self.time.t - self.behind_s

    async def sleep(self, seconds: float) -> None:
        self.time.t += max(seconds - self.early_s, min(seconds, 0.001))


@dataclass
class Row:
    tenant_id: str
    service_call_id: str
    state: str
    # None for a dueAt no datetime holds ('-infinity' in Postgres, which sorts first): claimed
    # as Unreadable (spoil() makes one).
    due_at: datetime | None
    correlation_id: str | None = None
    command_ts: int | None = None
    anchor_due_at: datetime | None = None
    repeat: Any = None
    occurrence_index: int = 0
    attempts: int = 0
    lease_owner: str | None = None
    lease_token: int | None = None
    lease_expires_at: float | None = None  # epoch seconds on the database clock
    claimed_at: datetime | None = None  # the recurrence reference (claim_due)
    first_claimed_at: float | None = None
    updated_at: float = 0.0  # epoch seconds on the database clock: the last command or record
    last_error: str | None = None
    carried: dict[str, str] | None = None
    deferred: list[int] = field(default_factory=list)  # deferred_seqs (never stale here)
    position: Position | None = None  # command_seq and command_stored_at
    paused_at: float | None = None  # paused by itself (pause with its serviceCallId), since when
    control: Position | None = None  # control_seq and control_stored_at: its last own pause or resume
    expire_after: str | None = None  # expireAfter (worker/core/expiry.py)
    fired_count: int = 0
    labels: dict[str, str] | None = None


class TwinStore:
    """adapters.postgres.store.Store in memory (FiringStore and IntakeStore), on a database clock `now`."""

    def __init__(self, now: Callable[[], float], stuck_after: timedelta = timedelta(hours=1)) -> None:
        self.now = now
        self.stuck_after = stuck_after
        self.rows: dict[Key, Row] = {}
        self._tokens = itertools.count(1)
        self.open: list[TwinBatch] = []  # batches whose transaction is open
        self.log: list[tuple[str, Any]] = []  # ("apply", commands) and the like, in order
        # paused_tenants: since when the tenant is paused (None: resumed), and the stream position
        # of the pause or resume that set it.
        self.paused_tenants: dict[str, tuple[float | None, Position | None]] = {}
        # timer_expiry: each occurrence's expiry decision, by its key and dueAt; committed at once,
        # so a batch rolled back (TwinBatch.roll_back) leaves it.
        self.decisions: dict[tuple[str, str, datetime], bool] = {}

    def _dt(self) -> datetime:
        return datetime.fromtimestamp(self.now(), UTC)

    def _claimed(self, row: Row) -> bool:
        return row.state == "Scheduled" and row.lease_expires_at is not None

    async def apply(
        self, commands: Sequence[Command], positions: Sequence[Position] | None = None
    ) -> Applied:
        keys = [(c.tenant_id, c.service_call_id) for c in commands]
        seqs: list[int | None] = [None] * len(commands) if positions is None else [p.seq for p in positions]
        # A row a batch in flight holds is locked (lock_keys); the twin's claims may always fire it.
        locked = {k: True for k in set(keys) if k in self.rows and self._in_flight(k)}
        order = StreamOrder(keys, seqs, locked)
        for indexes in order.rounds:
            sent = order.to_send(indexes)
            changed = {
                keys[i]
                for i in sent
                if self._apply_statement(commands[i], None if positions is None else positions[i])
            }
            held = {k: self._held(k) for k in order.unchanged(sent, changed) if k in self.rows}
            for m in order.decide(indexes, sent, changed, held):  # update_deferred_seqs
                row = self.rows[m.key]
                row.deferred = sorted({*row.deferred, m.seq} if m.waits else set(row.deferred) - {m.seq})
        self.log.append(("apply", list(commands)))
        touched = [self.rows.get(k) for k in keys]
        dues = [
            r.due_at
            for r in touched
            if r is not None
            and r.state == "Scheduled"
            and r.due_at is not None
            and (r.lease_expires_at is None or r.lease_expires_at < self.now())
        ]
        return Applied(order.outcomes, min(dues, default=None))

    def _stuck(self, row: Row) -> bool:
        return row.first_claimed_at is not None and (
            self.now() - row.first_claimed_at > self.stuck_after.total_seconds()
        )

    def _held(self, key: Key) -> Held:
        """held_among: why the key's commands may wait (the ordering decision is the core's)."""
        row = self.rows[key]
        claimed = self._claimed(row)
        head = row.deferred[0] if row.deferred else None
        return Held(claimed, claimed and self._stuck(row), head, bool(row.deferred), None)

    def _apply_statement(self, c: Command, position: Position | None) -> bool:
        """upsert_schedules or cancel_timers for one command: whether it changed the timer. Neither
        touches a claimed row, nor one a command older than this one waits for (held_among then
        says why: worker/core/ordering.py decides)."""
        key = (c.tenant_id, c.service_call_id)
        row = self.rows.get(key)
        seq = None if position is None else position.seq
        if row is not None and (
            self._claimed(row) or (row.deferred and seq is not None and seq > row.deferred[0])
        ):
            return False
        before = [] if row is None else row.deferred
        outcome = self._apply_free(c, row, position)
        if (now_row := self.rows.get(key)) is not None:  # a new Row keeps the others waiting
            now_row.deferred = [d for d in before if d != seq]
        return outcome == "applied"

    def _apply_free(self, c: Command, row: Row | None, position: Position | None) -> Outcome:
        """A command for a timer nothing holds up: the state machine of upsert_schedules and
        cancel_timers."""
        ts, kept = c.timestamp_ms, position
        if row is not None:
            by_ts = c.timestamp_ms is not None and row.command_ts is not None
            final = row.state in ("Reached", "Expired")
            if final or (by_ts and c.timestamp_ms < row.command_ts):  # type: ignore[operator]
                return "ignored"
            earlier = (
                position is not None
                and row.position is not None
                and position.seq < row.position.seq
                and position.stored_at <= row.position.stored_at
            )
            if not by_ts and earlier:  # earlier in the stream than the last one applied
                return "ignored"
            ts = ts if ts is not None else row.command_ts
            kept = kept or row.position
        if isinstance(c, ScheduleTimer):
            # Paused while it (paused_at) or its tenant is paused, as upsert_schedules stores it.
            own_pause = row.paused_at if row is not None else None
            state = "Paused" if own_pause is not None or self._tenant_paused(c.tenant_id) else "Scheduled"
            if (
                row is not None
                and row.state in ("Scheduled", "Paused")
                and (row.anchor_due_at, row.repeat)
                == (
                    c.due_at,
                    c.repeat,
                )
            ):  # a restatement keeps the timer's progress, and records what is newer
                now = (c.correlation_id, c.carried, ts, kept, c.labels)
                if (
                    row.correlation_id,
                    row.carried,
                    row.command_ts,
                    row.position,
                    row.labels,
                ) == now and row.state == state:
                    return "ignored"
                row.correlation_id, row.carried, row.command_ts, row.position, row.labels = now
                row.state, row.updated_at = state, self.now()
                return "applied"
            self.rows[c.tenant_id, c.service_call_id] = Row(
                c.tenant_id, c.service_call_id, state, c.due_at, c.correlation_id,
                ts, c.due_at, c.repeat, carried=c.carried, position=kept, updated_at=self.now(),
                paused_at=own_pause, control=row.control if row is not None else None,  # the column stays
                expire_after=c.expire_after,
                labels=c.labels,
            )  # fmt: skip
            return "applied"
        assert isinstance(c, CancelTimer)
        self.rows[c.tenant_id, c.service_call_id] = Row(
            c.tenant_id,
            c.service_call_id,
            "Cancelled",
            None,
            c.correlation_id,
            ts,
            position=kept,
            updated_at=self.now(),
            control=position or (row.control if row is not None else None),  # it ends a pause: cancel_timers
        )
        return "applied"

    async def pending_bounds(self, tenants: Sequence[str]) -> dict[str, int]:
        """Store.pending_bounds: the exact count is a bound too."""
        return (await self.quota_view([], tenants, cap=2**62))[1]

    async def quota_view(
        self, keys: Sequence[Key], tenants: Sequence[str], cap: int
    ) -> tuple[set[Key], dict[str, int]]:
        pending_states = ("Scheduled", "Paused")  # a paused timer is pending all the same
        known = {k for k in keys if k in self.rows and self.rows[k].state in (*pending_states, "Reached")}
        pending = {
            t: min(cap, sum(1 for r in self.rows.values() if r.tenant_id == t and r.state in pending_states))
            for t in tenants
        }
        return known, pending

    def _tenant_paused(self, tenant_id: str) -> bool:
        return self.paused_tenants.get(tenant_id, (None, None))[0] is not None

    async def pause(self, command: PauseTimers, position: Position | None = None) -> Applied:
        """Store.pause (worker/adapters/postgres/pausing.py): a tenant's flag, ordered by stream position,
        then its rows; or one timer. Paused rows are state Paused, which claim() never takes; a
        pause or resume clears claimed_at, so claim() applies the downtime rule on resume."""
        self.log.append(("pause", command))
        if command.service_call_id is not None:
            return self._pause_one((command.tenant_id, command.service_call_id), command.resume, position)
        tenant, now = command.tenant_id, self.now()
        since, last = self.paused_tenants.get(tenant, (None, None))
        later = (
            position is None or last is None or position.seq > last.seq or position.stored_at > last.stored_at
        )
        if tenant not in self.paused_tenants or later:
            self.paused_tenants[tenant] = (None if command.resume else (since or now), position)
        paused = self._tenant_paused(tenant)
        rows = [r for r in self.rows.values() if r.tenant_id == tenant]
        dues: list[datetime] = []
        for r in rows:
            if not command.resume and paused and r.state == "Scheduled" and r.lease_expires_at is None:
                r.state, r.claimed_at, r.updated_at = "Paused", None, now
            elif command.resume and not paused and r.state == "Paused" and r.paused_at is None:
                r.state, r.claimed_at, r.updated_at = "Scheduled", None, now
                if r.due_at is not None:
                    dues.append(r.due_at)
        if command.resume:
            left = [] if paused else [r for r in rows if r.state == "Paused" and r.paused_at is None]
        else:
            left = [r for r in rows if r.state == "Scheduled"] if paused else []
        # Only rows stuck behind a claim left: given up (tenant_left_scheduled).
        stuck = [
            r
            for r in left
            if r.first_claimed_at is not None and now - r.first_claimed_at > self.stuck_after.total_seconds()
        ]
        outcome: Outcome = "applied" if not left else "stuck" if len(stuck) == len(left) else "deferred"
        return Applied([outcome], min(dues, default=None))

    async def pause_timers(
        self, commands: Sequence[PauseTimers], positions: Sequence[Position] | None = None
    ) -> Applied:
        """Store.pause_timers (control_timers): each timer's own pause or resume, as _pause_one."""
        self.log.append(("pause_timers", list(commands)))
        keys = [(c.tenant_id, c.service_call_id) for c in commands if c.service_call_id is not None]
        if len(set(keys)) < len(commands):
            raise ValueError("pause_timers takes each timer once, by its serviceCallId")
        where = positions if positions is not None else [None] * len(commands)
        done = [self._pause_one(k, c.resume, p) for k, c, p in zip(keys, commands, where, strict=True)]
        dues = [d.soonest_due for d in done if d.soonest_due is not None]
        return Applied([d.outcomes[0] for d in done], min(dues, default=None))

    async def select_labelled(
        self, action: BulkAction, position: Position | None, after: str, limit: int
    ) -> list[str]:
        """Store.select_labelled (sql/queries/bulk.sql): the tenant's pending rows carrying the
        selector, after `after` in key order, but those a later ScheduleTimer defined."""
        self.log.append(("select_labelled", (action, after)))
        ids = sorted(
            r.service_call_id
            for r in self.rows.values()
            if r.tenant_id == action.tenant_id
            and r.service_call_id > after
            and r.state in ("Scheduled", "Paused")
            and action.selector.items() <= (r.labels or {}).items()
            and not (
                position is not None
                and r.position is not None
                and r.position.seq > position.seq
                and r.position.stored_at >= position.stored_at
            )
        )
        return ids[:limit]

    async def pause_listed(
        self, action: BulkAction, service_call_ids: Sequence[str], position: Position | None
    ) -> Applied:
        """Store.pause_listed: each listed timer still carrying the selector, as _pause_one."""
        done = [
            self._pause_one((action.tenant_id, i), action.kind == "resume", position)
            for i in sorted(service_call_ids)
            if action.selector.items()
            <= (getattr(self.rows.get((action.tenant_id, i)), "labels", None) or {}).items()
        ]
        dues = [d.soonest_due for d in done if d.soonest_due is not None]
        return Applied([d.outcomes[0] for d in done], min(dues, default=None))

    def _pause_one(self, key: Key, resume: bool, position: Position | None) -> Applied:
        row, now = self.rows.get(key), self.now()
        if row is None:
            return Applied(["ignored"], None)
        if self._in_flight(key):  # a claim's batch holds it: the pause or resume waits for its record
            return Applied(["deferred" if row.state == "Scheduled" else "ignored"], None)
        last = row.control
        # Older than its last pause or resume: changes nothing (control_timers).
        if (
            position is not None
            and last is not None
            and position.seq < last.seq
            and position.stored_at <= last.stored_at
        ):
            return Applied(["ignored"], None)
        # Recorded even when there is nothing to pause or resume: a pause deferred behind a claim may
        # come back after it; a finished timer's too, as a ScheduleTimer may re-arm it.
        row.control = position or row.control
        if resume:
            if row.paused_at is None or row.state not in ("Scheduled", "Paused"):
                return Applied(["ignored"], None)
            if row.lease_expires_at is not None:  # claimed as it was paused: its claim stays
                row.paused_at, row.updated_at = None, now
                return Applied(["applied"], row.due_at)
            row.state = "Paused" if self._tenant_paused(key[0]) else "Scheduled"
            row.paused_at, row.claimed_at, row.updated_at = None, None, now
            return Applied(["applied"], row.due_at if row.state == "Scheduled" else None)
        if row.state not in ("Scheduled", "Paused"):
            return Applied(["ignored"], None)
        row.paused_at = row.paused_at or now
        if row.lease_expires_at is not None:
            # A released claim fires after its back-off; its record stores the next one Paused.
            return Applied(["applied"], None)
        row.state = "Paused"
        row.claimed_at, row.updated_at = None, now
        return Applied(["applied"], None)

    def _end_frozen(self) -> None:
        """Postgres ends the session of a batch idle in its transaction past the lease
        (idle_in_transaction_session_timeout) and rolls its claim back: its rows as before it."""
        for batch in [b for b in self.open if self.now() >= b.deadline]:
            batch.roll_back()

    def _in_flight(self, key: Key) -> bool:
        """The key's row is locked by a batch still open (intake defers its commands: Store.apply)."""
        self._end_frozen()
        return any(
            row.tenant_id == key[0] and row.service_call_id == key[1]
            for b in self.open
            for row, _ in b.before
        )

    async def claim(self, params: ClaimParams) -> TwinBatch:
        """claim_due: a Scheduled row with no dueAt stands for one whose dueAt no datetime holds
        (Postgres' -infinity: due, and first), returned as Unreadable. The lease is in the rows at
        once (a twin has no other session to hide it from); a batch left open past its lease is
        rolled back, as Postgres does."""
        self._end_frozen()
        now = self.now()
        reach = now + params.ahead_ms / 1000
        downtime = now - params.downtime_ms / 1000
        free = [
            r
            for r in self.rows.values()
            if r.state == "Scheduled"
            and (r.due_at is None or r.due_at.timestamp() <= reach)  # None: '-infinity', due
            and (r.lease_expires_at is None or r.lease_expires_at < now)
        ]
        free.sort(key=lambda r: (r.due_at is not None, r.due_at or datetime.min.replace(tzinfo=UTC)))
        oldest = free[: params.limit - params.fresh_limit]
        fresh = [
            r
            for r in reversed(free)
            if r.due_at and r.due_at.timestamp() > now - params.fresh_window_ms / 1000
        ]
        taken = {(r.tenant_id, r.service_call_id): r for r in [*oldest, *fresh[: params.fresh_limit]]}
        token = next(self._tokens)
        claimed: list[Claimed] = []
        unreadable: list[Unreadable] = []
        before: list[tuple[Row, tuple[Any, ...]]] = []
        for r in taken.values():
            before.append(
                (
                    r,
                    (
                        r.lease_owner,
                        r.lease_token,
                        r.lease_expires_at,
                        r.attempts,
                        r.claimed_at,
                        r.first_claimed_at,
                    ),
                )
            )
            # The recurrence reference, as claim_due moves it (read before the lease is written):
            # now only after downtime, the timer claimable and unclaimed for downtime_ms.
            if r.claimed_at is None and r.due_at is not None and r.due_at.timestamp() >= downtime:
                r.claimed_at = min(r.due_at, self._dt())
            elif r.claimed_at is None or max(r.lease_expires_at or 0.0, r.updated_at) < downtime:
                r.claimed_at = self._dt()
            r.lease_owner, r.lease_token, r.lease_expires_at = (
                params.owner,
                token,
                now + params.lease_ms / 1000,
            )
            r.attempts += 1
            r.first_claimed_at = r.first_claimed_at or now
            row_id = f"{r.tenant_id}/{r.service_call_id}"
            if r.due_at is None:
                unreadable.append(Unreadable(r.tenant_id, r.service_call_id, token, r.attempts, row_id))
                continue
            claimed.append(
                Claimed(
                    r.tenant_id,
                    r.service_call_id,
                    r.due_at,
                    r.correlation_id,
                    token,
                    r.attempts,
                    r.repeat.every if r.repeat else None,
                    r.repeat.times if r.repeat else None,
                    r.repeat.timezone if r.repeat else None,
                    r.anchor_due_at,
                    r.occurrence_index,
                    r.claimed_at,
                    row_id,
                    carried=r.carried,
                    repeat_cron=r.repeat.cron if r.repeat else None,
                    repeat_until=r.repeat.until if r.repeat else None,
                    expire_after=r.expire_after,
                    repeat_catchup=r.repeat.catchup if r.repeat else None,
                )
            )
        later = [
            r.due_at.timestamp()
            for r in self.rows.values()
            if r.state == "Scheduled" and r.due_at is not None and r.due_at.timestamp() > reach
        ]
        next_due_in_ms = (min(later) - now) * 1000 if later else None
        self.log.append(("claim", claimed))
        batch = TwinBatch(self, ClaimResult(claimed, unreadable, next_due_in_ms, self._dt()), params.lease_ms)
        batch.before = before
        if taken:
            self.open.append(batch)
        return batch

    def spoil(self, key: Key) -> None:
        """Give a Scheduled row a dueAt no datetime holds, as '-infinity' in Postgres."""
        self.rows[key].due_at = None

    def _fenced(self, timer: Leased) -> Row | None:
        """The row this claim still holds, or None: the lease ran out or a newer claim took it."""
        row = self.rows.get((timer.tenant_id, timer.service_call_id))
        if row is None or row.lease_token != timer.lease_token:
            return None
        if row.lease_expires_at is None or row.lease_expires_at <= self.now():
            return None
        return row

    def _record_fired(self, fired: Sequence[Fired]) -> int:
        recorded = 0
        now = self.now()
        for f in fired:
            row = self._fenced(f.timer)
            if row is None or row.due_at != f.timer.due_at:
                continue
            recorded += 1
            row.lease_token = None
            self._record_firing(row, f, now)
            # An occurrence due already keeps this one's reference (record_fired).
            if f.next_due_at is None or f.next_due_at.timestamp() > now:
                row.claimed_at = None
        self.log.append(("record_fired", list(fired)))
        return recorded

    def _record_firing(self, row: Row, f: Fired, now: float) -> None:
        """What record_fired and record_fired_again both set: the lease gone, and Reached or the next
        occurrence (Paused when this one was claimed under its own pause or its tenant's)."""
        row.lease_owner = row.lease_expires_at = row.first_claimed_at = None
        # A finished timer keeps the count of claims that fired it (docs/CONTRACT.md, attempts).
        row.attempts = f.timer.attempts if f.next_due_at is None else 0
        row.last_error, row.updated_at = None, now
        row.fired_count += 0 if f.unfired else 1
        if f.next_due_at is None:
            row.state, row.paused_at = "Expired" if f.unfired else "Reached", None
        else:
            row.due_at, row.occurrence_index = f.next_due_at, f.next_index or 0
            row.state = "Paused" if row.paused_at or self._tenant_paused(row.tenant_id) else "Scheduled"

    async def record_again(self, fired: Sequence[Fired]) -> int:
        """record_fired_again: by key, only a row still holding that very occurrence (Scheduled, same
        dueAt, index and definition), with no live lease and no batch in flight holding it."""
        self._end_frozen()
        now = self.now()
        held = {(row.tenant_id, row.service_call_id) for b in self.open for row, _ in b.before}
        recorded = 0
        for f in fired:
            t = f.timer
            row = self.rows.get((t.tenant_id, t.service_call_id))
            if (
                row is None
                or row.state != "Scheduled"
                or (row.tenant_id, row.service_call_id) in held
                or (row.lease_expires_at is not None and row.lease_expires_at >= now)
                or _occurrence(row) != _occurrence_of(t)
            ):
                continue
            recorded += 1
            self._record_firing(row, f, now)
            # The claim's reference, which the rollback took from the row (record_fired_again).
            due_now = f.next_due_at is not None and f.next_due_at.timestamp() <= now
            row.claimed_at = t.recurrence_ref if due_now else None
        self.log.append(("record_fired_again", list(fired)))
        return recorded

    async def decide_expiry(self, due: Sequence[Claimed], expired: Collection[Key]) -> set[Key]:
        """decide_expiry: each occurrence's first decision stands; the keys of those that expire."""
        stood: set[Key] = set()
        for c in due:
            key = (c.tenant_id, c.service_call_id)
            nominal = c.due_at if c.nominal_due_at is None else c.nominal_due_at
            if self.decisions.setdefault((*key, nominal), key in expired):
                stood.add(key)
        self.log.append(("decide_expiry", list(due)))
        return stood

    def _retry_later(self, failed: Sequence[Failed]) -> int:
        released = 0
        for timer, error, backoff_ms in failed:
            row = self._fenced(timer)
            if row is None:
                continue
            released += 1
            row.lease_owner, row.lease_expires_at = None, self.now() + backoff_ms / 1000
            row.last_error = row.last_error if error is None else error
        self.log.append(("retry_later", list(failed)))
        return released


def _occurrence(row: Row) -> tuple[Any, ...]:
    """The occurrence a row holds and its definition, as record_fired_again compares them."""
    r = row.repeat
    repeat = (None,) * 5 if r is None else (r.every, r.times, r.timezone, r.cron, r.until)
    return (row.due_at, row.occurrence_index, row.anchor_due_at, *repeat)


def _occurrence_of(t: Claimed) -> tuple[Any, ...]:
    """The same, of the claimed occurrence that was published."""
    repeat = (t.repeat_every, t.repeat_times, t.repeat_timezone, t.repeat_cron, t.repeat_until)
    return (t.due_at, t.occurrence_index, t.anchor_due_at, *repeat)


class TwinBatch:
    """Store.claim's batch (ClaimedBatch): a closed batch stays claimed until the lease runs out,
    and one left open past its lease is rolled back (TwinStore._end_frozen); recorded then, it
    raises and changes nothing, as the adapter's does once idle_in_transaction_session_timeout
    (the lease) ended its session."""

    def __init__(self, store: TwinStore, result: ClaimResult, lease_ms: int) -> None:
        self.store, self.result = store, result
        self.deadline = store.now() + lease_ms / 1000
        self.before: list[tuple[Row, tuple[Any, ...]]] = []
        self.ended = self.killed = False

    async def record(self, fired: Sequence[Fired], failed: Sequence[Failed]) -> int:
        if self.ended:
            raise TransientError("the batch already ended")
        self.store._end_frozen()
        self.ended = True
        if self in self.store.open:
            self.store.open.remove(self)
        if self.killed:
            raise TransientError("postgres: 25P03 terminating connection due to idle-in-transaction timeout")
        recorded = self.store._record_fired(fired) if fired else 0
        if failed:
            self.store._retry_later(failed)
        return recorded

    async def close(self) -> None:
        self.ended = True
        if self in self.store.open:
            self.store.open.remove(self)

    def roll_back(self) -> None:
        """Its session ended (the replica died, or froze past the lease): Postgres rolls the claim
        back, and its rows are as before it."""
        for row, before in self.before:
            (row.lease_owner, row.lease_token, row.lease_expires_at, row.attempts, row.claimed_at,
             row.first_claimed_at) = before  # fmt: skip
        self.killed = True
        if self in self.store.open:
            self.store.open.remove(self)


@dataclass
class Publish:
    """One call of a publish method: which, with what, at what time on the database clock."""

    method: str
    messages: list[Outgoing]
    at: float


class TwinPublisher:
    """The JetStream broker's publishing (EventPublisher), into a stream kept in memory that, like
    JetStream's, stores each Nats-Msg-Id once. `fail(message)` says why a message is refused."""

    def __init__(self, time: Callable[[], float], prefix: str = "timer") -> None:
        self.time = time
        self.subjects = Subjects(prefix)
        self.ids = MessageIds(b"twin fleet secret, 32 bytes long")
        self.max_payload = 1024 * 1024
        self.stored: dict[str, Outgoing] = {}
        self.calls: list[Publish] = []
        self.hints: list[tuple[str, bytes]] = []
        self.fail: Callable[[Outgoing], BaseException | None] = lambda m: None
        self.on_publish: Callable[[], None] = lambda: None  # runs while a publish is on the wire
        self.gate: asyncio.Event | None = None  # if given, a publish stays on the wire until it is set

    async def _publish(self, method: str, messages: Sequence[Outgoing]) -> list[BaseException | None]:
        self.calls.append(Publish(method, list(messages), self.time()))
        self.on_publish()
        if self.gate is not None:
            await self.gate.wait()
        results: list[BaseException | None] = []
        for m in messages:
            error = self.fail(m)
            if error is None and not m.subject.startswith(f"{self.subjects.prefix}."):
                error = nats.errors.NoRespondersError()  # no stream takes the subject
            if error is None:
                self.stored.setdefault(m.headers.get("Nats-Msg-Id", str(len(self.stored))), m)
            results.append(error)
        return results

    async def publish_atomic(
        self, messages: Sequence[Outgoing], timeout: float
    ) -> list[BaseException | None]:
        return await self._publish("atomic", messages)

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        return await self._publish("many", messages)

    async def hint(self, subject: str, payload: bytes) -> None:
        self.hints.append((subject, payload))


@dataclass
class Acks:
    """What intake answered to each command, by stream sequence, in order: "+ACK", "-NAK ..."."""

    log: list[tuple[int, bytes]] = field(default_factory=list)
    shared: list[tuple[str, Any]] | None = None  # a log to interleave with (TwinStore.log)

    async def publish(self, subject: str, payload: bytes = b"", **_: Any) -> None:
        seq = int(subject.split(".")[5])
        self.log.append((seq, payload))
        if self.shared is not None:
            kind = "ack" if payload in (b"", b"+ACK") else "wip" if payload == b"+WPI" else "nak"
            self.shared.append((kind, (seq, payload)))

    def of(self, seq: int) -> list[str]:
        return ["+ACK" if p in (b"", b"+ACK") else p.decode() for s, p in self.log if s == seq]


class TwinCommands:
    """The command stream's pull subscription (CommandSource): commands as JetStream would
    deliver them, real nats Msg objects whose acknowledgements land in `acks`."""

    def __init__(self, stream: str = "TIMER_COMMANDS") -> None:
        self.stream = stream
        self.queue: list[Msg] = []
        self.acks = Acks()
        self.checks = 0  # check_streams_soon calls
        self._seq = itertools.count(1)

    def add(self, subject: str, body: dict[str, Any] | bytes) -> Msg:
        seq = next(self._seq)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        reply = f"$JS.ACK.{self.stream}.timer-service.1.{seq}.{seq}.0.0"
        msg = Msg(_client=self.acks, subject=subject, reply=reply, data=data)  # type: ignore[arg-type]
        self.queue.append(msg)
        return msg

    def redeliver(self, msg: Msg) -> Msg:
        """The same command again, as JetStream sends one that was not acknowledged."""
        again = Msg(_client=self.acks, subject=msg.subject, reply=msg.reply, data=msg.data)  # type: ignore[arg-type]
        self.queue.append(again)
        return again

    async def command_subscription(self) -> TwinCommands:
        return self

    def check_streams_soon(self) -> None:
        self.checks += 1

    async def unsubscribe(self) -> None:
        pass

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        if not self.queue:
            raise nats.errors.TimeoutError
        taken, self.queue = self.queue[:batch], self.queue[batch:]
        return taken


class TwinBroker(TwinPublisher, TwinCommands):
    """Intake's broker: commands in, DLQ copies and wake hints out."""

    def __init__(self, time: Callable[[], float], prefix: str = "timer") -> None:
        TwinPublisher.__init__(self, time, prefix)
        TwinCommands.__init__(self)


def claim_params(
    owner: str,
    limit: int,
    fresh_limit: int = 0,
    *,
    lease_ms: int,
    ahead_ms: int = 0,
    fresh_window_ms: int = 86_400_000,
    downtime_ms: int | None = None,
) -> ClaimParams:
    """A test's shorthand for a ClaimParams (the loops build theirs in full, FiringLoop): a test
    names what it checks; downtime defaults to the lease, the shortest the service allows."""
    return ClaimParams(
        owner=owner,
        limit=limit,
        fresh_limit=fresh_limit,
        lease_ms=lease_ms,
        ahead_ms=ahead_ms,
        fresh_window_ms=fresh_window_ms,
        downtime_ms=lease_ms if downtime_ms is None else downtime_ms,
    )
