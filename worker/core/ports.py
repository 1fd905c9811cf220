"""What the loops need from the outside world, as small protocols: the adapters satisfy them and
tests/twins.py holds in-memory twins, checked against each other by test_port_conformance.py."""

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
    """One claim, its rows locked in one transaction until it is recorded or closed."""

    @property
    def result(self) -> ClaimResult: ...

    async def record(self, fired: Sequence[Fired], failed: Sequence[Failed]) -> int:
        """Record the fired and release the failed, together, and end the batch; how many the fence let
        through. Raises, changing nothing, when the batch was ended under it."""
        ...

    async def close(self) -> None:
        """End the batch if record did not (its claims stay claimed until the lease ends); safe twice."""
        ...


class FiringStore(Protocol):
    """The firing loop's database: claim a batch under a lease, record it in the claim's transaction."""

    async def claim(self, params: ClaimParams) -> ClaimedBatch:
        """Claim up to `params.limit` due occurrences under a new lease token; unreadable rows come
        back, not raised."""
        ...

    async def record_again(self, fired: Sequence[Fired]) -> int:
        """Record, in a transaction of its own, firings whose batch raised in record after their PubAck;
        rows a command or another claim changed since are left alone. How many were recorded."""
        ...

    async def decide_expiry(self, due: Sequence[Claimed], expired: Collection[Key]) -> set[Key]:
        """Commit, before any is published, whether each occurrence expires (its key in `expired`) or
        fires; an earlier decision stands. The keys decided to expire."""
        ...


class IntakeStore(Protocol):
    """Intake's database: a batch of commands in one transaction, each timer's in stream order
    (`positions`)."""

    async def apply(
        self, commands: Sequence[Command], positions: Sequence[Position] | None = None
    ) -> Applied: ...

    async def pending_bounds(self, tenants: Sequence[str]) -> dict[str, int]:
        """For the quota: each tenant's pending timers or more (never fewer), cheaply."""
        ...

    async def quota_view(
        self, keys: Sequence[Key], tenants: Sequence[str], cap: int
    ) -> tuple[set[Key], dict[str, int]]:
        """For the quota, exactly: the keys already held, and each tenant's pending timers up to `cap`."""
        ...

    async def pause(self, command: PauseTimers, position: Position | None = None) -> Applied:
        """Pause or resume a tenant or a timer: its outcome and the soonest dueAt a resume made
        claimable."""
        ...

    async def pause_timers(
        self, commands: Sequence[PauseTimers], positions: Sequence[Position] | None = None
    ) -> Applied:
        """Timers' own pauses and resumes, no timer twice: each one's outcome as pause gives it, and the
        soonest dueAt."""
        ...

    async def select_labelled(
        self, action: BulkAction, position: Position | None, after: str, limit: int
    ) -> list[str]:
        """A bulk action's next chunk: up to `limit` matching serviceCallIds after `after`, in key
        order, but those a later ScheduleTimer defined."""
        ...

    async def pause_listed(
        self, action: BulkAction, service_call_ids: Sequence[str], position: Position | None
    ) -> Applied:
        """A bulk pause's or resume's chunk, on the timers still carrying the selector; outcomes in key
        order."""
        ...


class TimerReader(Protocol):
    """The read model's database: a tenant's timers among `service_call_ids`, by serviceCallId."""

    async def get_many(self, tenant_id: str, service_call_ids: Sequence[str]) -> dict[str, StoredTimer]: ...


class FinishedTimers(Protocol):
    """Retention's database: delete finished rows older than `retention`, keeping the quota's counts
    small."""

    async def delete_finished(self, retention: timedelta, limit: int) -> int: ...

    async def delete_decided(self, limit: int) -> int:
        """Delete up to `limit` expiry decisions whose occurrence is gone; how many went."""
        ...

    async def compact_pending(self, limit: int) -> int:
        """Fold up to `limit` rows of the quota's bounds into one per tenant; how many."""
        ...


class EventPublisher(Protocol):
    """Publishing to JetStream: per message, None once acknowledged, else the error; never raises for
    one."""

    subjects: Subjects
    ids: MessageIds

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
    """A fetch the broker could not make now; intake waits a moment and fetches again."""


class CommandBatches(Protocol):
    """A pull subscription: TimeoutError when no command came in `timeout`, FetchFailed when it could
    not ask."""

    async def fetch(self, batch: int, timeout: float) -> Sequence[ReceivedCommand]: ...

    async def unsubscribe(self) -> None:
        """Let go of the subscription; never raises for a connection already gone."""


class CommandSource(Protocol):
    async def command_subscription(self) -> CommandBatches: ...

    def check_streams_soon(self) -> None:
        """A fetch failed as a missing stream or consumer would explain: look, in the background."""


class IntakeBroker(CommandSource, EventPublisher, Protocol):
    """Intake reads commands and publishes rejected ones to the DLQ, on one connection."""
