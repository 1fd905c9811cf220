"""The domain types the ports speak: a timer's key, a claimed occurrence, a fired one, a failed
one, the outcome of a command. The core defines them; the adapters import them (never the reverse)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

# deferred: the key's occurrence is claimed, the command waits for it; stuck: it has been claimed
# for longer than TIMER_STUCK_AFTER without being recorded, and the command is given up.
# partial: a command on many timers did one step's share of them; the bulk lane steps it again.
# busy: the timer's row is locked by a batch that holds no occurrence of it (a claim that rechecked
# the row and left it out: sql/queries/intake.sql, lock_keys); offered again soon, not after a lease.
BulkKind = Literal["cancel", "pause", "resume"]
Outcome = Literal["applied", "ignored", "deferred", "stuck", "partial", "busy"]
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BulkAction:
    """A CancelTimer, PauseTimers or ResumeTimers naming `labels` instead of a serviceCallId, as
    the validation boundary read it (worker.core.commands): the action on every timer of the tenant
    carrying all of `selector`'s pairs (docs/CONTRACT.md, Labels)."""

    tenant_id: str
    selector: dict[str, str]  # at least one pair
    kind: BulkKind
    correlation_id: str | None = None
    timestamp_ms: int | None = None  # a CancelTimer's: decides per timer, as for one timer's


@dataclass(frozen=True, slots=True)
class Position:
    """Where a command sits in the command stream: its sequence and the time JetStream stored it.
    Together they order a timer's commands without timestampMs (sql/queries/intake.sql, upsert_schedules):
    the sequence alone starts again at 1 when the stream is recreated, the time tells the two apart."""

    seq: int
    stored_at: datetime


@dataclass(frozen=True, slots=True)
class Applied:
    """What a batch of commands did: each one's outcome, in order, and the soonest dueAt of the
    timers it left Scheduled and unclaimed (changed or only locked): a claim that ran while the
    batch held their rows skipped them, so the firing loops are woken for it (Intake._hint)."""

    outcomes: list[Outcome]
    soonest_due: datetime | None


class Claimed(NamedTuple):
    """One claimed occurrence: what to publish, and the fence to record it with.

    A NamedTuple, not a frozen dataclass: a replica builds a thousand per claim, and a frozen
    dataclass's __init__ (one object.__setattr__ per field) was 13 % of its CPU in a drain
    (docs/BENCHMARKS.md, "Where the time went"); a NamedTuple is one tuple.__new__ from the row
    (worker/adapters/postgres/claim.py reads it from claim_due's columns by name)."""

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
    # The recurrence reference: a recurring timer's next occurrence is the first due after this.
    # Stored in the column claimed_at, but not always when this occurrence was claimed: claim_due
    # keeps the first claim's across a crash, starts a fresh occurrence from its own dueAt, and
    # moves it to now only after downtime (sql/queries/). The column keeps its name: renaming
    # it takes two releases (docs/UPGRADING.md); claim_due returns it AS recurrence_ref.
    recurrence_ref: datetime
    # The store's handle on the claimed row version, opaque to the core (Postgres: its ctid, which
    # the claim's row lock keeps still until the batch ends; sql/queries/firing.sql, record_fired).
    row_id: str
    # The fields below default to None: most timers have none of them.
    # The ScheduleTimer's carried headers (trace context, allowed producer headers), or None.
    carried: dict[str, str] | None = None
    # A cron schedule (instead of repeat_every) and the end of either kind (sql/migrations/0009).
    repeat_cron: str | None = None
    repeat_until: datetime | None = None
    # The ScheduleTimer's `data` as JSON text (jsonb's output, spliced into the event), or None.
    data: str | None = None
    # A firing window (worker/core/window.py, sql/migrations/0016): due_at above is then the
    # instant the occurrence is planned to fire at, the claim key, and this its dueAt, which the
    # event and the recurrence speak of. None without a window, where due_at is both.
    nominal_due_at: datetime | None = None
    fire_window: str | None = None  # the ScheduleTimer's `window`, as given
    expire_after: str | None = None  # the ScheduleTimer's `expireAfter`, as given (worker/core/expiry.py)
    repeat_catchup: str | None = None  # repeat.catchup: "one" (or None), "none", "all"
    caught_up: int | None = None  # "all": missed occurrences fired in a row so far (claim_due)
    # The timer's labels as JSON text (jsonb's output, spliced into the event), or None (0017).
    labels: str | None = None


class Unreadable(NamedTuple):
    """A claimed occurrence whose dueAt no datetime holds: it fails alone (worker/core/fireable.py)."""

    tenant_id: str
    service_call_id: str
    lease_token: int
    attempts: int
    row_id: str


# A claimed occurrence as its fence reads it (tenant_id, service_call_id, lease_token, attempts):
# one to publish, or one whose dueAt could not be read. The two types, not a protocol of the four
# fields: nothing else holds a lease.
Leased = Claimed | Unreadable


# Claims reach this far ahead (ClaimParams.ahead_ms; claim_due): the firing loop, its wake-ups and
# the intake store (lock_keys: could a claim hold this row?) share it. A cancel or reschedule that
# arrives later than this before dueAt may find the occurrence already claimed, and it fires
# (README, guarantees).
LOOKAHEAD_MS = 100

# repeat.catchup "all" (docs/USING.md, Recurring timers): at most this many missed occurrences of a timer
# fire in a row, oldest first, each its own claim and event; past that the rest are skipped, as
# with "one". A bound on what one timer's outage costs the fleet and its consumer.
CATCHUP_MAX = 100


@dataclass(frozen=True, slots=True)
class ClaimParams:
    """What one claim asks for (sql/queries/firing.sql, claim_due), as River's JobGetAvailableParams: one
    typed value taken by the port, Store and the twin, so the three cannot drift apart on seven
    positional numbers, and no default exists that only a test wants."""

    owner: str  # the replica, written as lease_owner
    limit: int  # occurrences at most
    fresh_limit: int  # of which the most recently due (the fresh lane); the rest are the oldest
    lease_ms: int  # the lease written into each claimed row
    ahead_ms: int  # "due" reaches this far ahead of the database clock
    fresh_window_ms: int  # "most recently due" means due no longer ago than this
    # A timer left claimable and unclaimed this long had no replica to claim it: downtime, and a
    # recurring timer's missed occurrences are skipped (docs/USING.md, Recurring timers).
    downtime_ms: int


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claimed: list[Claimed]
    unreadable: list[Unreadable]
    next_due_in_ms: float | None  # until the next occurrence beyond the claim's reach
    db_now: datetime  # the database clock at the end of the claim
    # When db_now arrived (time.monotonic), before its rows were read: the clock estimate starts
    # from there, not from when the loop got to it (None: now).
    received: float | None = None


class Fired(NamedTuple):
    """A published occurrence to record, with the next one for a recurring timer."""

    timer: Claimed
    next_due_at: datetime | None  # with a window, the next occurrence's planned instant
    next_index: int | None
    next_nominal: datetime | None = None  # with a window, the next occurrence's dueAt
    # Recorded as not fired (worker/core/expiry.py): expired (its DLQ entry was acknowledged
    # instead), or missed and skipped (repeat.catchup "none"). Its timer goes on with its next
    # occurrence; one that has none ends Expired.
    unfired: bool = False


# An occurrence that did not fire, released for a retry by any replica: (the occurrence, the error
# recorded on its row or None to keep the row's, the back-off in milliseconds). None: postponed,
# not failed (FiringLoop, a cron count the replica's budget could not take now).
Failed = tuple[Leased, str | None, int]
