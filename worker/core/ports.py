"""What the loops need from the outside world, as small protocols.

The loops (firing, intake, the read model, retention) take these rather than the concrete Store
and Broker: the real adapters satisfy them (mypy checks it where the replica wires them up,
worker/service.py), and tests/twins.py holds in-memory twins for unit tests of the loops' logic.
tests/integration/test_port_conformance.py runs one set of checks against both, so a twin cannot
drift from what its adapter does. They speak the domain's types (worker/core/domain.py), never an
adapter's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import timedelta
from typing import Protocol

from worker.contract import Command, MessageIds, Outgoing, PauseTimers, Subjects
from worker.core.domain import (
    Applied,
    BulkAction,
    Claimed,
    ClaimParams,
    ClaimResult,
    Failed,
    Fired,
    Key,
    Position,
)
from worker.core.received import ReceivedCommand
from worker.core.timers import StoredTimer


class ClaimedBatch(Protocol):
    """One claim, open until it is recorded or closed: Postgres holds its rows locked in one
    transaction, from the claim to its record (docs/RELIABILITY.md, The claim's transaction)."""

    @property
    def result(self) -> ClaimResult: ...

    async def record(self, fired: Sequence[Fired], failed: Sequence[Failed]) -> int:
        """Record the fired occurrences and release the failed ones for a retry after their back-off,
        together, and end the batch; returns how many records the fence let through. Raises, and
        changes nothing, when the batch was ended under it (its session killed)."""
        ...

    async def close(self) -> None:
        """End the batch if record did not: what it claimed stays claimed until the lease runs
        out. Always called, and safe to call twice."""
        ...


class FiringStore(Protocol):
    """The firing loop's database: claim a batch under a lease, then record each claimed
    occurrence in the claim's own transaction (ClaimedBatch)."""

    async def claim(self, params: ClaimParams) -> ClaimedBatch:
        """Claim up to `params.limit` due occurrences under a new lease token, in a transaction the
        batch holds open until it is recorded or closed. Rows whose dueAt no datetime holds come
        back as `unreadable`, not raised."""
        ...

    async def record_again(self, fired: Sequence[Fired]) -> int:
        """Record, in a transaction of its own, firings whose batch raised in record after their
        PubAck (its claim rolled back with it): each row still holding that very occurrence,
        unleased and unlocked, is recorded as record would have; one a command changed or another
        claim holds since is left alone. Returns how many were recorded."""
        ...

    async def decide_expiry(self, due: Sequence[Claimed], expired: Collection[Key]) -> set[Key]:
        """Record, committed before any of them is published, whether each occurrence of `due`
        (one per timer) expires (its key in `expired`) or fires; an occurrence decided before
        (its claim rolled back after the publish) keeps that decision. The keys of those whose
        decision is to expire."""
        ...


class IntakeStore(Protocol):
    """Intake's database: apply a batch of commands in one transaction, each timer's in the order
    of their places in the stream (`positions`): one earlier than the last applied to the timer
    is ignored, a command waiting for its timer holds up the later ones; what the quota reads."""

    async def apply(
        self, commands: Sequence[Command], positions: Sequence[Position] | None = None
    ) -> Applied: ...

    async def pending_bounds(self, tenants: Sequence[str]) -> dict[str, int]:
        """For the quota: each tenant's pending timers or more (never fewer), cheaply."""
        ...

    async def quota_view(
        self, keys: Sequence[Key], tenants: Sequence[str], cap: int
    ) -> tuple[set[Key], dict[str, int]]:
        """For the quota, exactly: the keys already Scheduled, Paused or Reached, and each tenant's
        pending timers up to `cap`."""
        ...

    async def pause(self, command: PauseTimers, position: Position | None = None) -> Applied:
        """Pause or resume a tenant or one timer: its one outcome ("deferred": offer it again later)
        and the soonest dueAt a resume made claimable again."""
        ...

    async def pause_timers(
        self, commands: Sequence[PauseTimers], positions: Sequence[Position] | None = None
    ) -> Applied:
        """Timers' own pauses and resumes (each naming its serviceCallId, no timer twice), any tenants',
        together: the outcome of each, in order, as pause would give it alone, and the soonest dueAt
        the resumes made claimable again."""
        ...

    async def select_labelled(
        self, action: BulkAction, position: Position | None, after: str, limit: int
    ) -> list[str]:
        """A bulk action's next chunk: up to `limit` serviceCallIds after `after`, in key order, of
        the tenant's Scheduled or Paused timers carrying every pair of its selector, but those a
        ScheduleTimer later in the stream than `position` defined."""
        ...

    async def pause_listed(
        self, action: BulkAction, service_call_ids: Sequence[str], position: Position | None
    ) -> Applied:
        """A bulk pause's or resume's chunk: each of these timers that still carries the selector,
        as its own pause or resume at `position` would; the outcome of each, in key order."""
        ...


class TimerReader(Protocol):
    """The read model's database: those of a tenant's timers that exist among `service_call_ids`,
    by serviceCallId (timers.timer_view shows them)."""

    async def get_many(self, tenant_id: str, service_call_ids: Sequence[str]) -> dict[str, StoredTimer]: ...


class FinishedTimers(Protocol):
    """Retention's database: delete up to `limit` Reached/Cancelled rows older than `retention`; keep
    the quota's counts small."""

    async def delete_finished(self, retention: timedelta, limit: int) -> int: ...

    async def delete_decided(self, limit: int) -> int:
        """Delete up to `limit` expiry decisions (FiringStore.decide_expiry) whose occurrence its
        timer no longer holds; how many went."""
        ...

    async def compact_pending(self, limit: int) -> int:
        """Fold up to `limit` rows of the quota's per-tenant bounds into one per tenant; how many."""
        ...


class EventPublisher(Protocol):
    """Publishing to JetStream. For each message, None once the stream acknowledged it, else why
    not; no call raises for a message that failed (worker/adapters/jetstream/publisher.py)."""

    subjects: Subjects
    ids: MessageIds  # the Nats-Msg-Ids of what it publishes

    @property
    def max_payload(self) -> int: ...

    async def publish_atomic(
        self, messages: Sequence[Outgoing], timeout: float
    ) -> list[BaseException | None]: ...

    async def publish_many(
        self, messages: Sequence[Outgoing], timeout: float
    ) -> list[BaseException | None]: ...

    async def hint(self, subject: str, payload: bytes) -> None: ...


class FetchFailed(Exception):
    """A fetch the broker could not make now (reconnecting, the consumer's stream without a leader
    for a moment, or gone): intake waits a moment and fetches again. Its text says why."""


class CommandBatches(Protocol):
    """A pull subscription: up to `batch` commands, TimeoutError when none came in `timeout`,
    FetchFailed when the broker could not ask."""

    async def fetch(self, batch: int, timeout: float) -> Sequence[ReceivedCommand]: ...

    async def unsubscribe(self) -> None:
        """Let go of the subscription; never raises for a connection that is already gone."""


class CommandSource(Protocol):
    async def command_subscription(self) -> CommandBatches: ...

    def check_streams_soon(self) -> None:
        """A fetch failed in a way a missing stream or consumer would explain: look, in the background."""


class IntakeBroker(CommandSource, EventPublisher, Protocol):
    """Intake reads commands and publishes rejected ones to the DLQ, on one connection."""
