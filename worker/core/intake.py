"""Command intake: pull commands, validate, commit in batches, and only then acknowledge."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime

from worker import metrics, tracing
from worker.config import Settings
from worker.contract import (
    INVALID_TENANT,
    Command,
    Outgoing,
    PauseTimers,
    Rejection,
    ScheduleTimer,
    headers_size,
)
from worker.core import lane, quota
from worker.core.bulk import BulkActions, Progress
from worker.core.clock import Clock
from worker.core.commands import Parsed, parse_command, parse_control
from worker.core.crashpoints import crash_point
from worker.core.domain import Applied, BulkAction, Outcome, Position
from worker.core.headers import carried_headers
from worker.core.lane import BulkLane, Held, kind_of
from worker.core.loop import Loop
from worker.core.ordering import superseded_controls
from worker.core.ports import FetchFailed, IntakeBroker, IntakeStore
from worker.core.received import ReceivedCommand, answer, position
from worker.core.waiting import Slices, retry_transient, wait_any
from worker.core.wakeup import Wakeup
from worker.errors import TransientError, verdict

log = logging.getLogger(__name__)

FETCH_WAIT_S = 1.0
# A command whose key could not be written is offered again after this long.
RETRY_DELAY_S = 2.0
# A command whose row a batch holds without firing it ("busy") is offered again after about such a
# batch.
BUSY_RETRY_S = 0.1


class Intake(Loop[IntakeStore, IntakeBroker]):
    def __init__(
        self, settings: Settings, store: IntakeStore, broker: IntakeBroker, wakeup: Wakeup, clock: Clock
    ) -> None:
        super().__init__(settings, store, broker, wakeup, clock)
        self._carry = settings.carried_names
        self._received: Counter[tuple[str, ...]] = Counter()
        self._bulk = BulkActions(store)
        self.lane = BulkLane(self._lane_step, self._lane_settle, self._retry_in)

    async def run(self, stop: asyncio.Event) -> None:
        """Until stop: fetch a batch and handle it; a batch in hand is finished, never dropped."""
        sub = await self.broker.command_subscription()
        stepping = asyncio.create_task(self.lane.run(stop), name="bulk-lane")
        try:
            while not stop.is_set():
                metrics.tick("intake")
                if stepping.done():
                    stepping.result()  # a fatal verdict ends intake with it
                try:
                    msgs = await sub.fetch(self.s.intake_batch_size, timeout=FETCH_WAIT_S)
                except TimeoutError:
                    continue
                except FetchFailed as exc:
                    # Reconnecting, or no stream leader for a moment: both pass; a deleted consumer is
                    # put back.
                    log.warning("fetch failed", extra={"action": "fetch_failed", "error": str(exc)})
                    self.broker.check_streams_soon()
                    await wait_any(1.0, stop)
                    continue
                try:
                    await self.handle(msgs)
                except Exception as exc:
                    # Unanswered commands come back after the ack wait; only a fatal verdict ends
                    # intake.
                    if verdict(exc) == "fatal":
                        raise
                    log.error(
                        "intake batch failed",
                        extra={"action": "intake_failed", "error": f"{type(exc).__name__}: {exc}"},
                        exc_info=verdict(exc) == "alone",
                    )
                    await wait_any(1.0, stop)
        finally:
            # Before the connection drains, so held commands go back now, not after the ack wait.
            self.lane.close()
            await asyncio.gather(stepping, return_exceptions=True)
            await sub.unsubscribe()

    async def handle(self, msgs: Sequence[ReceivedCommand]) -> None:
        with tracing.process_span(self.s.command_stream, self.s.consumer, msgs) as span:
            now = datetime.now(UTC)
            commands: list[tuple[ReceivedCommand, Parsed]] = []
            rejected: list[tuple[ReceivedCommand, Rejection]] = []
            try:
                slices = Slices()
                for msg in msgs:
                    await slices.check()
                    parsed = self.parse(msg, now)
                    if isinstance(parsed, Rejection):
                        rejected.append((msg, parsed))
                    else:
                        commands.append((msg, parsed))
            finally:
                metrics.inc_many(metrics.COMMANDS_RECEIVED, self._received)
            span.set_attribute("timer.rejected", len(rejected))
            if rejected:
                await self.reject(rejected)
            if commands and self.s.tenant_max_pending:  # off by default: then no extra read
                commands = await self._within_quota(commands)
            span.set_attribute("timer.valid", len(commands))
            if commands:
                await self.apply(commands)

    async def _within_quota(
        self, batch: list[tuple[ReceivedCommand, Parsed]]
    ) -> list[tuple[ReceivedCommand, Parsed]]:
        """The batch without the ScheduleTimers over their tenant's limit; those go to the DLQ."""
        limit = self.s.tenant_max_pending
        try:
            over = set(await quota.over_limit(self.store, [c for _, c in batch], limit))
        except TransientError as exc:
            log.warning("intake batch failed", extra={"action": "intake_failed", "error": str(exc)})
            for msg, _ in batch:
                await answer(msg, RETRY_DELAY_S)
            return []
        if over:
            await self.reject(
                [
                    (
                        msg,
                        Rejection(
                            "quota_exceeded", _quota_detail(command.tenant_id, limit), command.tenant_id
                        ),
                    )
                    for msg, command in (batch[i] for i in sorted(over))
                ]
            )
        return [b for i, b in enumerate(batch) if i not in over]

    def parse(self, msg: ReceivedCommand, now: datetime) -> Parsed | Rejection:
        where = self.broker.subjects.split(msg.subject)
        if where is None or (kind := where[1]) not in ("schedule", "cancel", "pause", "resume"):
            return Rejection("bad_subject", "subject is not <prefix>.<tenant>.timer.<kind>", INVALID_TENANT)
        tenant = where[0]
        self._received[(kind,)] += 1  # counted once per batch (handle)
        if kind == "pause" or kind == "resume":
            return parse_control(kind, tenant, msg.data)
        command = parse_command(
            kind,
            tenant,
            msg.data,
            now=now,
            max_horizon=self.s.max_horizon,
            max_payload_bytes=self.s.max_payload_bytes,
        )
        if msg.headers and isinstance(command, ScheduleTimer):
            carried, dropped = carried_headers(msg.headers, self._carry)
            if dropped:  # never a rejection: the timer is stored without them
                metrics.CARRIED_HEADERS_DROPPED.inc(len(dropped))
                log.debug(
                    "invalid headers not carried",
                    extra={"action": "headers_dropped", "tenant": tenant, "headers": dropped},
                )
            if carried:
                command = dataclasses.replace(command, carried=carried)
        return command

    async def reject(self, rejected: Sequence[tuple[ReceivedCommand, Rejection]]) -> None:
        """Copy each command, unchanged, to its tenant's DLQ and acknowledge it once stored; pipelined."""
        copies = [self._dlq_copy(msg, why) for msg, why in rejected]
        results = await self.broker.publish_many(copies, self.s.publish_timeout_ms / 1000)
        failed: BaseException | None = None
        for (msg, why), error in zip(rejected, results, strict=True):
            if error is not None:  # the DLQ is unreachable: keep the command, try again later
                failed = failed or error
                await answer(msg, RETRY_DELAY_S)
                continue
            await answer(msg)
            metrics.COMMANDS_REJECTED.labels(why.reason).inc()
            log.info(
                "command rejected",
                extra={
                    "action": "command_rejected",
                    "reason": why.reason,
                    "detail": why.detail,
                    "tenant": why.dlq_token,
                },
            )
        if failed is not None:
            log.warning("dlq publish failed", extra={"action": "dlq_failed", "error": str(failed)})

    def _dlq_copy(self, msg: ReceivedCommand, why: Rejection) -> Outgoing:
        where = position(msg)
        headers = {
            "Timer-Error": why.reason,
            "Timer-Error-Detail": why.detail,
            "Timer-Subject": msg.subject[:200],
            # From the command's stream position: a copy made again after a lost PubAck is deduplicated.
            "Nats-Msg-Id": self.broker.ids.derived(self.s.command_stream, where.seq, where.stored_at),
        }
        data = self._fit(msg.data, headers)
        return Outgoing(self.broker.subjects.of(why.dlq_token, "dlq"), data, headers)

    def _fit(self, data: bytes, headers: dict[str, str]) -> bytes:
        """The body for its DLQ copy, cut (and a header says how long it was) if the copy would pass the
        server's max_payload, which would drop our connection."""
        limit = self.broker.max_payload
        header_bytes = headers_size(headers) + 64
        if len(data) + header_bytes <= limit:
            return data
        headers["Timer-Body-Truncated"] = str(len(data))
        return data[: max(0, limit - header_bytes)]

    async def apply(self, batch: list[tuple[ReceivedCommand, Parsed]]) -> None:
        """Apply the batch in stream order: runs of schedules and cancels in one transaction, runs of
        pauses and resumes in one call, many-timer commands to the bulk lane."""
        placed = [(msg, command, position(msg)) for msg, command in batch]
        superseded = superseded_controls([c for _, c, _ in placed])
        run: list[tuple[ReceivedCommand, Command, Position]] = []
        controls: list[tuple[ReceivedCommand, PauseTimers, Position]] = []
        full: list[tuple[ReceivedCommand, Rejection]] = []
        for i, (msg, command, where) in enumerate(placed):
            if isinstance(command, BulkAction) or (
                isinstance(command, PauseTimers) and command.service_call_id is None
            ):
                if not await self.lane.submit(msg, command, where):
                    full.append((msg, Rejection("bulk_backlog", _backlog_detail(), command.tenant_id)))
            elif isinstance(command, PauseTimers):
                if i not in superseded:
                    await self._apply_commands(run)
                    run.clear()
                    controls.append((msg, command, where))
            else:
                await self._apply_controls(controls)
                controls.clear()
                run.append((msg, command, where))
        await self._apply_commands(run)
        await self._apply_controls(controls)
        if full:
            await self.reject(full)
        for i in sorted(superseded):
            msg, command, _ = placed[i]
            metrics.COMMANDS_APPLIED.labels(kind_of(command), "superseded").inc()  # type: ignore[arg-type]
            await answer(msg)

    async def _apply_controls(self, batch: list[tuple[ReceivedCommand, PauseTimers, Position]]) -> None:
        """A run of timers' own pauses and resumes in one store call, each at its place in the stream."""
        if not batch:
            return
        commands, positions = [c for _, c, _ in batch], [p for _, _, p in batch]
        try:
            done = await retry_transient(
                functools.partial(self.store.pause_timers, commands, positions), 5, first_s=0.1, max_s=2
            )
        except TransientError as exc:
            log.warning("intake batch failed", extra={"action": "intake_failed", "error": str(exc)})
            for msg, _, _ in batch:  # nothing committed, nothing acknowledged: they come back
                await answer(msg, RETRY_DELAY_S)
            return
        for (msg, command, _), outcome in zip(batch, done.outcomes, strict=True):
            await self._settle_control(msg, command, outcome)
        await self._hint(done.soonest_due)

    async def _lane_step(self, held: Held) -> Applied:
        """A chunk of a bulk action's timers or a tenant's rows; every step can run again."""
        command = held.command
        if isinstance(command, BulkAction):
            if not isinstance(held.progress, Progress):
                held.progress = Progress()
            step = functools.partial(self._bulk.step, command, held.where, held.progress)
        else:
            step = functools.partial(self.store.pause, command, held.where)
        done = await retry_transient(step, 5, first_s=0.1, max_s=2)
        await self._hint(done.soonest_due)
        return done

    async def _lane_settle(self, held: Held, done: Applied) -> None:
        await self._settle_control(held.msg, held.command, done.outcomes[0])

    async def _settle_control(
        self, msg: ReceivedCommand, command: PauseTimers | BulkAction, outcome: Outcome
    ) -> None:
        if outcome == "stuck":  # only rows stuck behind a claim left: give up, visibly
            log.warning("commands given up", extra={"action": "commands_stuck", "count": 1})
            why = Rejection("timer_stuck", _stuck_detail(self.s), command.tenant_id)
            return await self.reject([(msg, why)])
        kind = kind_of(command)
        metrics.COMMANDS_APPLIED.labels(kind, outcome).inc()
        if isinstance(command, PauseTimers):
            log.info(
                f"{kind} applied",
                extra={
                    "action": f"timers_{kind}d",
                    "tenant": command.tenant_id,
                    "service_call_id": command.service_call_id,
                    "outcome": outcome,
                },
            )
        await answer(msg, self._retry_in(outcome))

    async def _apply_commands(self, batch: list[tuple[ReceivedCommand, Command, Position]]) -> None:
        if not batch:
            return
        started = time.perf_counter()
        try:
            applied = await self._apply_retrying([c for _, c, _ in batch], [p for _, _, p in batch])
        except TransientError as exc:
            log.warning("intake batch failed", extra={"action": "intake_failed", "error": str(exc)})
            for msg, _, _ in batch:
                await answer(msg, RETRY_DELAY_S)
            return
        metrics.COMMAND_BATCH_SECONDS.observe(time.perf_counter() - started)
        crash_point("committed")
        stuck: list[tuple[ReceivedCommand, Rejection]] = []
        outcomes: Counter[tuple[str, ...]] = Counter()
        try:
            for (msg, command, _), outcome in zip(batch, applied.outcomes, strict=True):
                kind = "schedule" if isinstance(command, ScheduleTimer) else "cancel"
                if outcome == "stuck":  # waited past TIMER_STUCK_AFTER: give up, visibly
                    stuck.append((msg, Rejection("timer_stuck", _stuck_detail(self.s), command.tenant_id)))
                    continue
                outcomes[kind, outcome] += 1
                await answer(msg, self._retry_in(outcome))
        finally:
            metrics.inc_many(metrics.COMMANDS_APPLIED, outcomes)
        if stuck:
            log.warning(
                "commands given up",
                extra={"action": "commands_stuck", "count": len(stuck), "detail": stuck[0][1].detail},
            )
            await self.reject(stuck)
        await self._hint(applied.soonest_due)

    def _retry_in(self, outcome: Outcome) -> float | None:
        """When a command with this outcome is offered again; None: acknowledged. Deferred: after a
        lease; busy: once the holding batch ended; partial: at once, for the rest."""
        return {"deferred": self.s.lease_ms / 1000, "busy": BUSY_RETRY_S, "partial": 0.0}.get(outcome)

    async def _apply_retrying(self, commands: list[Command], positions: list[Position]) -> Applied:
        return await retry_transient(lambda: self.store.apply(commands, positions), 5, first_s=0.1, max_s=2)

    async def _hint(self, soonest_due: datetime | None) -> None:
        """Tell every replica's firing loop when the soonest timer the batch committed or locked comes
        due: a claim meanwhile skipped the locked row, and its next wake-up counts only rows beyond
        its reach."""
        if soonest_due is None:
            return
        soonest = soonest_due.timestamp()
        if soonest - self.clock.now() > self.s.poll_interval_ms / 1000:
            return  # the regular poll will see it in time
        self.wakeup.hint(soonest)
        await self.broker.hint(self.broker.subjects.wake, f"{soonest:.3f}".encode())


def _stuck_detail(s: Settings) -> str:
    return (
        f"the timer's occurrence has been claimed for over {s.stuck_after} without being recorded "
        "(TIMER_STUCK_AFTER); see its lastError"
    )


def _backlog_detail() -> str:
    return (
        f"this replica holds {lane.HELD_PER_TENANT} of the tenant's commands on many timers, or "
        f"{lane.HELD_MAX} in all: send it again once those are done"
    )


def _quota_detail(tenant_id: str, limit: int) -> str:
    return f"tenant {tenant_id} has {limit} pending timers (TIMER_TENANT_MAX_PENDING)"
