"""The domain types the ports speak. The core defines them; the adapters import them, never the reverse."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal, NamedTuple

# deferred: waits for its claimed occurrence; stuck: given up past TIMER_STUCK_AFTER; partial: a bulk
# step; busy: row locked by a batch.
BulkKind = Literal["cancel", "pause", "resume"]
Outcome = Literal["applied", "ignored", "deferred", "stuck", "partial", "busy"]
Key = tuple[str, str]


@dataclass(frozen=True, slots=True)
class BulkAction:
    """A cancel, pause or resume of every timer of the tenant carrying all of `selector`'s pairs."""

    tenant_id: str
    selector: dict[str, str]  # at least one pair
    kind: BulkKind
    correlation_id: str | None = None
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Position:
    """Where a command sits in the stream; the time tells apart streams whose sequences restart at 1."""

    seq: int
    stored_at: datetime


@dataclass(frozen=True, slots=True)
class Applied:
    """What a batch of commands did, and the soonest dueAt it left unclaimed: a claim skipped those
    rows."""

    outcomes: list[Outcome]
    soonest_due: datetime | None


class Claimed(NamedTuple):
    """One claimed occurrence: what to publish, and the fence to record it with. A NamedTuple: a claim
    builds a thousand, and a frozen dataclass's __init__ is far slower."""

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
    # A recurring timer's next occurrence is the first due after this; stored in the column claimed_at.
    recurrence_ref: datetime
    # The store's handle on the claimed row version, opaque to the core (Postgres: its ctid).
    row_id: str
    carried: dict[str, str] | None = None
    repeat_cron: str | None = None
    repeat_until: datetime | None = None
    # The `data` as JSON text, spliced into the event.
    data: str | None = None
    # With a firing window, due_at is the planned instant and this the dueAt; None without one.
    nominal_due_at: datetime | None = None
    fire_window: str | None = None
    expire_after: str | None = None
    repeat_catchup: str | None = None
    caught_up: int | None = None
    labels: str | None = None


class Unreadable(NamedTuple):
    """A claimed occurrence whose dueAt no datetime holds: it fails alone."""

    tenant_id: str
    service_call_id: str
    lease_token: int
    attempts: int
    row_id: str


Leased = Claimed | Unreadable


# How far ahead claims reach; a cancel arriving later than this before dueAt may find it claimed.
LOOKAHEAD_MS = 100

# repeat.catchup "all": at most this many missed occurrences fire in a row, bounding an outage's cost.
CATCHUP_MAX = 100


@dataclass(frozen=True, slots=True)
class ClaimParams:
    """What one claim asks for: one typed value, so the port, Store and the twin cannot drift apart."""

    owner: str
    limit: int
    fresh_limit: int  # of which the most recently due (the fresh lane)
    lease_ms: int
    ahead_ms: int
    fresh_window_ms: int
    # Unclaimed this long means downtime: a recurring timer's missed occurrences are skipped.
    downtime_ms: int


@dataclass(frozen=True, slots=True)
class ClaimResult:
    claimed: list[Claimed]
    unreadable: list[Unreadable]
    next_due_in_ms: float | None
    db_now: datetime
    # When db_now arrived (time.monotonic): the clock estimate starts there (None: now).
    received: float | None = None


class Fired(NamedTuple):
    """A published occurrence to record, with the next one for a recurring timer."""

    timer: Claimed
    next_due_at: datetime | None
    next_index: int | None
    next_nominal: datetime | None = None
    # Recorded as not fired (expired, or missed and skipped); the timer goes on with its next
    # occurrence.
    unfired: bool = False


# (the occurrence, its error or None to keep the row's, the back-off in ms); None: postponed, not
# failed.
Failed = tuple[Leased, str | None, int]
