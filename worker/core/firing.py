"""The firing loop: claim due occurrences, in two lanes and up to PIPELINE_DEPTH batches at once, and
fire each batch (worker/core/publishing.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from worker import metrics, tracing
from worker.config import Settings
from worker.core.clock import Clock
from worker.core.domain import LOOKAHEAD_MS, ClaimParams
from worker.core.ports import ClaimedBatch, EventPublisher, FiringStore
from worker.core.publishing import BatchFiring
from worker.core.waiting import wait_any
from worker.core.wakeup import Wakeup
from worker.errors import verdict

log = logging.getLogger(__name__)

# A failed claim is retried after this, doubling up to the poll interval: a dropped connection breaks
# every pooled one, so a blip should cost a few fast retries, not a stall.
CLAIM_RETRY_FIRST_S = 0.05
# While a backlog drains, a second lane claims the newest occurrences, so they do not wait behind it.
FRESH_LANE_BATCH = 50
FRESH_LANE_S = 0.1
FRESH_LANE_WINDOW_MS = 2000  # "newest": due in the last two seconds, not the backlog's tail
# One batch publishing while the next is claimed; each holds a pooled connection across its publish.
PIPELINE_DEPTH = 2
# The next claim's spacing while occurrences keep coming due: each reaches LOOKAHEAD_MS ahead, so
# successive windows overlap and every instant is claimed before it is due.
CLAIM_SPACING_S = LOOKAHEAD_MS / 2 / 1000


async def _until_at_most(tasks: set[asyncio.Task[None]], keep: int) -> None:
    """Wait until at most `keep` tasks run; an error of one that ended is raised here."""
    while len(tasks) > keep:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        tasks -= done
        errors = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
        if errors:
            raise errors[0]


def _first(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    first = errors.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


class FiringLoop(BatchFiring):
    """Claims due occurrences and fires each batch it claims (BatchFiring.fire)."""

    def __init__(
        self, settings: Settings, store: FiringStore, broker: EventPublisher, wakeup: Wakeup, clock: Clock
    ) -> None:
        super().__init__(settings, store, broker, wakeup, clock)
        # A live replica claims at least once a poll interval; a timer unclaimed past
        # TIMER_DOWNTIME_AFTER had no replica: downtime.
        downtime_ms = round(settings.downtime_after.total_seconds() * 1000)
        self._main = ClaimParams(
            owner=settings.worker_id,
            limit=settings.batch_size,
            fresh_limit=0,
            lease_ms=settings.lease_ms,
            ahead_ms=LOOKAHEAD_MS,
            fresh_window_ms=FRESH_LANE_WINDOW_MS,  # unused: the main lane's claims have no fresh places
            downtime_ms=downtime_ms,
        )
        self._fresh = ClaimParams(
            owner=settings.worker_id,
            limit=FRESH_LANE_BATCH,
            fresh_limit=FRESH_LANE_BATCH,
            lease_ms=settings.lease_ms,
            ahead_ms=LOOKAHEAD_MS,
            fresh_window_ms=FRESH_LANE_WINDOW_MS,
            downtime_ms=downtime_ms,
        )
        self._idle_s = settings.poll_interval_ms / 1000
        self._backlog = asyncio.Event()  # set while claims come back full
        # Tests only: told "claimed" after each claim, so a test can wait with a deadline instead of
        # yielding.
        self.test_signal: Callable[[str], None] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Until stop: claim, fire, sleep until the next occurrence; in-flight work finishes. Every task
        it starts belongs to one TaskGroup, so cancelling the loop cancels them all and nothing
        outlives it."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._fresh_lane(stop), name="fresh-lane")
                try:
                    await self._claim_until(stop, group)
                finally:
                    self._backlog.set()  # wake the lane so it sees the stop
        except BaseExceptionGroup as errors:  # the supervisor reports the error itself, not a group
            raise _first(errors) from None

    async def _claim_until(self, stop: asyncio.Event, group: asyncio.TaskGroup) -> None:
        poll_s = self.s.poll_interval_ms / 1000
        failures = 0
        firing: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            metrics.tick("firing")  # alive, even while Postgres is down
            try:
                full = await self._tick_beside(firing, group)
                failures = 0
            except Exception as exc:  # only fatal ends the loop (errors.verdict)
                if (judged := verdict(exc)) == "fatal":
                    raise
                failures += 1
                log.warning(
                    "claim failed",
                    extra={"action": "claim_failed", "error": f"{type(exc).__name__}: {exc}"},
                    exc_info=judged == "alone",
                )
                await self.wakeup.sleep(min(CLAIM_RETRY_FIRST_S * 2 ** (failures - 1), poll_s), stop)
                continue
            if full:
                self._backlog.set()
            else:
                self._backlog.clear()
                await self.wakeup.sleep(self._idle_s, stop)

    async def _fresh_lane(self, stop: asyncio.Event) -> None:
        """While a backlog drains in big batches, claim the newest few every FRESH_LANE_S, so that
        timers coming due meanwhile do not wait behind a full batch."""
        while not stop.is_set():
            await self._backlog.wait()
            if stop.is_set():
                return
            try:
                with tracing.span("timer.claim", **{"timer.lane": "fresh"}) as span:
                    batch = await self.store.claim(self._fresh)
                    result = batch.result
                    span.set_attribute("timer.count", len(result.claimed) + len(result.unreadable))
                self.clock.observe(result.db_now, result.received)
                await self.fire(batch)
            except Exception as exc:  # never fatal: its claims expire and fire elsewhere
                log.warning("fresh lane failed", extra={"action": "claim_failed", "error": str(exc)})
            await wait_any(FRESH_LANE_S, stop)

    async def tick(self) -> bool:
        """One claim, fired here; True when the batch was full (more may be due)."""
        batch, full, wake_at = await self._claim()
        await self.fire(batch)
        self._idle_until(wake_at)
        return full

    async def _tick_beside(self, firing: set[asyncio.Task[None]], group: asyncio.TaskGroup) -> bool:
        """One claim fired beside the next one, at most PIPELINE_DEPTH in flight."""
        started = time.monotonic()
        batch, full, wake_at = await self._claim()
        if batch.result.claimed or batch.result.unreadable:
            try:
                firing.add(group.create_task(self._fire_beside(batch), name="fire"))
            except BaseException:
                await batch.close()
                raise
        await _until_at_most(firing, PIPELINE_DEPTH - 1)
        self._idle_until(wake_at if wake_at is None else max(wake_at, started + CLAIM_SPACING_S))
        return full

    async def _claim(self) -> tuple[ClaimedBatch, bool, float | None]:
        """The main lane's claim (open), whether it was full, and when (monotonic) the next occurrence
        is in reach."""
        started = time.perf_counter()
        with tracing.span("timer.claim") as span:
            batch = await self.store.claim(self._main)
            result = batch.result
            span.set_attribute("timer.count", len(result.claimed) + len(result.unreadable))
        metrics.CLAIM_SECONDS.observe(time.perf_counter() - started)
        if self.test_signal is not None:
            self.test_signal("claimed")
        self.clock.observe(result.db_now, result.received)
        nxt = result.next_due_in_ms
        wake_at = None if nxt is None else time.monotonic() + (nxt - LOOKAHEAD_MS) / 1000
        # Unreadable rows took places in the batch too: a full claim of them is still a backlog.
        return batch, len(result.claimed) + len(result.unreadable) >= self.s.batch_size, wake_at

    def _idle_until(self, wake_at: float | None) -> None:
        poll_s = self.s.poll_interval_ms / 1000
        self._idle_s = poll_s if wake_at is None else min(poll_s, max(0.0, wake_at - time.monotonic()))

    async def _fire_beside(self, batch: ClaimedBatch) -> None:
        """A batch fired beside the next claim: Postgres away is no reason to end the loop; its claims
        expire."""
        try:
            await self.fire(batch)
        except Exception as exc:  # only fatal ends the loop
            if (judged := verdict(exc)) == "fatal":
                raise
            log.warning(
                "record failed",
                extra={"action": "claim_failed", "error": f"{type(exc).__name__}: {exc}"},
                exc_info=judged == "alone",
            )
