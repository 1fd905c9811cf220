"""The firing loop: claim due occurrences, publish DueTimeReached, mark them, fenced by the lease."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from worker import metrics, tracing
from worker.config import Settings
from worker.contract import DUE_AT_RANGE, EARLIEST_DUE_AT, LATEST_DUE_AT, Outgoing, due_event, iso, wire_size
from worker.core.budget import TenantBudgets
from worker.core.clock import Clock
from worker.core.crashpoints import crash_point
from worker.core.domain import LOOKAHEAD_MS, Claimed, ClaimParams, Failed, Fired, Key, Leased, Unreadable
from worker.core.headers import stored_carried_problem
from worker.core.loop import Loop
from worker.core.ports import ClaimedBatch, EventPublisher, FiringStore
from worker.core.recurrence import next_of
from worker.core.waiting import Slices, wait_any
from worker.core.wakeup import Wakeup
from worker.errors import verdict

log = logging.getLogger("worker.firing")

# A failed publish is retried by any replica after this long.
RETRY_BACKOFF_MS = 1000
# A row that cannot be made into an event (its dueAt unreadable or out of range, its repeat
# broken) is retried after RETRY_BACKOFF_MS, doubling with each attempt up to this: it stays
# visible (attempts, lastError) and never spins the loop.
ROW_RETRY_MAX_MS = 300_000
# What next occurrences cost beyond NEXT_FREE_S each (a rare cron schedule, skipped occurrences
# counted for `times`: worker/core/budget.py) takes at most a tenth of the loop's time per tenant,
# a tenth of a second saved up, and a quarter of it for all tenants together. A common schedule's
# costs 10 to 40 us and is never charged; the free part is about what firing any row costs the
# replica anyway (~30 us), so a claim of rows just under it holds the loop ~0.1 s at most. A
# recurring row met while its tenant's budget is overdrawn, or a cron one while the total is, is
# put back, unfired and with no error, for POSTPONE_MS; every other row goes on.
NEXT_SHARE = 0.1
NEXT_BURST_S = 0.1
NEXT_TOTAL_SHARE = 0.25
NEXT_TOTAL_BURST_S = 0.25
NEXT_FREE_S = 0.0001
POSTPONE_MS = 1000
# A failed claim is retried after this, doubling up to the poll interval. A dropped connection
# leaves every pooled one broken, each failing one claim: starting at seconds, that stalled a
# replica long after a blip (chaos scenario latency-drops, docs/RELIABILITY.md); starting small,
# a blip costs a few fast retries, and an outage one attempt per poll.
CLAIM_RETRY_FIRST_S = 0.05
# While a backlog drains, a second lane claims the newest this many occurrences this often.
FRESH_LANE_BATCH = 50
FRESH_LANE_S = 0.1
FRESH_LANE_WINDOW_MS = 2000  # "newest" means due in the last two seconds, not the backlog's tail
# Batches in flight at once per replica: one publishing and marking while the next is claimed.
# Each holds a pooled connection across its publish (its claim's transaction), as does the fresh
# lane's: Settings.db_pool_size leaves room for intake and the reads beside them.
PIPELINE_DEPTH = 2
# While occurrences keep coming due, the next claim goes out this long after the one before,
# while that one's batch still waits for its last occurrences: each claim reaches LOOKAHEAD_MS
# ahead, so the window of the next overlaps it and every instant is claimed before it is due.
# Waiting for a batch to end before claiming again left the occurrences due between its reach
# and the next claim (a mark and a claim long) late: p99 11 to 16 ms at 1,000 due/s on one
# replica (docs/BENCHMARKS.md, lateness).
CLAIM_SPACING_S = LOOKAHEAD_MS / 2 / 1000


async def _no_results() -> list[BaseException | None]:
    return []


async def _until_at_most(tasks: set[asyncio.Task[None]], keep: int) -> None:
    """Wait until at most `keep` tasks run; an error of one that ended is raised here."""
    while len(tasks) > keep:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        tasks -= done
        errors = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
        if errors:
            raise errors[0]


def _first(errors: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error of a task group, however deeply nested."""
    first = errors.exceptions[0]
    return _first(first) if isinstance(first, BaseExceptionGroup) else first


class FiringLoop(Loop[FiringStore, EventPublisher]):
    def __init__(
        self, settings: Settings, store: FiringStore, broker: EventPublisher, wakeup: Wakeup, clock: Clock
    ) -> None:
        super().__init__(settings, store, broker, wakeup, clock)
        # A live replica claims at least once a poll interval, so an expired lease is re-claimed
        # within one; a timer left claimable for TIMER_DOWNTIME_AFTER (at least a lease plus a
        # poll interval, config.py) had no replica: downtime, and a missed occurrence is skipped.
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
        self.next_budget = TenantBudgets(
            NEXT_SHARE, NEXT_BURST_S, NEXT_TOTAL_SHARE, NEXT_TOTAL_BURST_S
        )  # both lanes' batches share it
        self._backlog = asyncio.Event()  # set while claims come back full
        # Tests only (River's testsignal): told "claimed" after each of tick's claims, so a test
        # proves that no claim went out by waiting for the signal with a deadline, not by
        # yielding a few times and hoping. Production leaves it None.
        self.test_signal: Callable[[str], None] | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Until stop: claim, fire, sleep until the next occurrence. In-flight work finishes.

        The next claim goes out as soon as one comes back full, else when the next occurrence
        comes within reach but CLAIM_SPACING_S after the one before at the earliest: up to
        PIPELINE_DEPTH batches publish and mark at once, so neither Postgres nor NATS waits
        for the other (docs/BENCHMARKS.md, "Where the time went").

        Every task this loop starts (the fresh lane, each batch's fire) belongs to one TaskGroup:
        a stop lets them finish, and cancelling this loop (the replica's hard stop) or its failure
        cancels them all, so nothing outlives it (a mark waiting on a row lock held the exit of a
        replica for as long as the lock was held). Their unmarked claims expire and fire elsewhere.
        """
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._fresh_lane(stop), name="fresh-lane")
                try:
                    await self._claim_until(stop, group)
                finally:
                    self._backlog.set()  # wake the lane so it sees the stop and finishes its batch
        except BaseExceptionGroup as errors:  # the supervisor reports the error itself, not a group
            raise _first(errors) from None

    async def _claim_until(self, stop: asyncio.Event, group: asyncio.TaskGroup) -> None:
        poll_s = self.s.poll_interval_ms / 1000
        failures = 0
        firing: set[asyncio.Task[None]] = set()
        while not stop.is_set():
            metrics.tick("firing")  # alive, even while Postgres is down (readiness says that)
            try:
                full = await self._tick_beside(firing, group)
                failures = 0
            except Exception as exc:  # one verdict for all (errors.verdict): only fatal ends the loop
                if (judged := verdict(exc)) == "fatal":
                    raise
                failures += 1
                log.warning(
                    "claim failed",
                    extra={"action": "claim_failed", "error": f"{type(exc).__name__}: {exc}"},
                    exc_info=judged == "alone",  # not foreseen: show where
                )
                await self.wakeup.sleep(min(CLAIM_RETRY_FIRST_S * 2 ** (failures - 1), poll_s), stop)
                continue
            if full:
                self._backlog.set()
            else:
                self._backlog.clear()
                await self.wakeup.sleep(self._idle_s, stop)

    async def _fresh_lane(self, stop: asyncio.Event) -> None:
        """While a backlog drains in big batches, claim the newest few every FRESH_LANE_S.

        A full batch of a thousand takes a while to claim, publish and mark; timers coming due
        meanwhile would wait behind it. This lane keeps their lateness to about FRESH_LANE_S.
        """
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
            except Exception as exc:  # never fatal: its claims expire and fire elsewhere, or here later
                log.warning("fresh lane failed", extra={"action": "claim_failed", "error": str(exc)})
            await wait_any(FRESH_LANE_S, stop)

    async def tick(self) -> bool:
        """One claim, fired here; True when the batch was full (more may be due)."""
        batch, full, wake_at = await self._claim()
        await self.fire(batch)
        self._idle_until(wake_at)
        return full

    async def _tick_beside(self, firing: set[asyncio.Task[None]], group: asyncio.TaskGroup) -> bool:
        """One claim whose firing goes on beside the next claim, in the loop's `group` (at most
        PIPELINE_DEPTH of them in `firing`): at once while batches come back full, else after
        CLAIM_SPACING_S at the earliest."""
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
        """The main lane's claim (its batch, open), whether it came back full, and when
        (time.monotonic) the next occurrence comes within reach of a claim (None: none is known)."""
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
        # Wake when the next occurrence comes within reach of a claim, measured from now.
        wake_at = None if nxt is None else time.monotonic() + (nxt - LOOKAHEAD_MS) / 1000
        # Unreadable rows took places in the batch too: a full claim of them is still a backlog.
        return batch, len(result.claimed) + len(result.unreadable) >= self.s.batch_size, wake_at

    def _idle_until(self, wake_at: float | None) -> None:
        """After a claim's firing: an idle loop sleeps until `wake_at`, at most a poll interval."""
        poll_s = self.s.poll_interval_ms / 1000
        self._idle_s = poll_s if wake_at is None else min(poll_s, max(0.0, wake_at - time.monotonic()))

    async def _fire_beside(self, batch: ClaimedBatch) -> None:
        """A batch fired beside the next claim, in the loop's task group: Postgres away or
        read-only past the lease is no reason to end the loop (and the group with it); its
        claims expire and fire again, from here or elsewhere."""
        try:
            await self.fire(batch)
        except Exception as exc:  # one verdict for all (errors.verdict): only fatal ends the loop
            if (judged := verdict(exc)) == "fatal":
                raise
            log.warning(
                "mark failed",
                extra={"action": "claim_failed", "error": f"{type(exc).__name__}: {exc}"},
                exc_info=judged == "alone",
            )

    async def fire(self, batch: ClaimedBatch) -> None:
        """Publish each occurrence of a claimed batch as soon as it is due on the database clock,
        then record them all; the batch ends here whatever happens."""
        try:
            if batch.result.claimed or batch.result.unreadable:
                await self._fire(batch, batch.result.claimed, batch.result.unreadable)
        finally:
            await batch.close()

    async def _fire(
        self, batch: ClaimedBatch, claimed: list[Claimed], unreadable: Sequence[Unreadable]
    ) -> None:
        metrics.CLAIMED.inc(len(claimed) + len(unreadable))
        reclaimed = [c.attempts for c in claimed] + [u.attempts for u in unreadable]
        metrics.LEASES_RECLAIMED.inc(sum(1 for n in reclaimed if n > 1))
        crash_point("claimed")
        failed: list[Failed] = []
        for u in unreadable:
            self._cannot_fire(
                u, "unreadable_due_at", "dueAt cannot be read (infinite, or not in years 1-9999)", failed
            )
        nexts: dict[Key, tuple[datetime | None, int | None]] = {}
        postponed = 0
        # Each tenant's budget bounds its own costly rows; the slices bound what many tenants'
        # add up to in one claim (40 tenants' budgets held the loop 2 s): other batches and the
        # fresh lane go on between them.
        slices = Slices()
        for c in claimed:
            await slices.check()
            if not EARLIEST_DUE_AT <= c.due_at <= LATEST_DUE_AT:
                self._cannot_fire(
                    c, "due_at_out_of_range", f"dueAt {iso(c.due_at)} is outside {DUE_AT_RANGE}", failed
                )
                continue
            if (problem := stored_carried_problem(c.carried)) is not None:
                self._cannot_fire(c, "bad_carried_headers", problem, failed)
                continue
            recurring = c.repeat_every is not None or c.repeat_cron is not None
            if recurring and not self.next_budget.ready(c.tenant_id, costly=c.repeat_cron is not None):
                postponed += 1
                failed.append((c, None, POSTPONE_MS))
                continue
            started = time.perf_counter()
            try:  # computed before the publish: an event goes out only when its row can be recorded
                nexts[c.tenant_id, c.service_call_id] = next_of(c)
            except Exception as exc:  # whatever the row's values break, the row alone fails
                if verdict(exc) != "alone":
                    raise
                self._cannot_fire(c, "bad_repeat", f"next occurrence: {type(exc).__name__}: {exc}", failed)
            if recurring:
                self.next_budget.charge(c.tenant_id, time.perf_counter() - started - NEXT_FREE_S)
        if postponed:
            metrics.POSTPONED.labels("next_occurrence").inc(postponed)
            log.info(
                "recurring timers postponed",
                extra={"action": "postponed", "reason": "next_occurrence", "count": postponed},
            )
        waiting = sorted(
            (c for c in claimed if (c.tenant_id, c.service_call_id) in nexts), key=lambda c: c.due_at
        )
        fired: list[Fired] = []
        # Each due instant's events go out when it comes, not after the PubAcks of the instant
        # before: waiting for those made every later event of the claim a round trip later.
        # All are acknowledged (or failed) before anything is recorded.
        sends: list[asyncio.Task[None]] = []
        try:
            while waiting:
                now = self.clock.now()  # never ahead of the database clock: never early
                ready = bisect.bisect_right(waiting, now, key=lambda c: c.due_at.timestamp())
                if ready == 0:
                    await self.clock.sleep(waiting[0].due_at.timestamp() - now)
                    continue
                group, waiting = waiting[:ready], waiting[ready:]
                at = datetime.fromtimestamp(now, UTC)
                sends.append(asyncio.create_task(self._publish(group, at, nexts, fired, failed)))
            for send in sends:
                await send
        finally:
            for send in sends:
                send.cancel()  # after an error or a stop: those still out end here too
            await asyncio.gather(*sends, return_exceptions=True)
        crash_point("published")
        await self._record(batch, fired, failed)
        crash_point("marked")
        # A recurring timer's next occurrence was unknown when this claim looked ahead.
        if upcoming := [f.next_due_at for f in fired if f.next_due_at is not None]:
            self.wakeup.hint(min(upcoming).timestamp())

    def _cannot_fire(self, timer: Leased, reason: str, error: str, failed: list[Failed]) -> None:
        """One row's failure: recorded on the row and retried with back-off; the batch goes on."""
        backoff_ms = min(ROW_RETRY_MAX_MS, RETRY_BACKOFF_MS * 2 ** min(max(timer.attempts - 1, 0), 20))
        failed.append((timer, error, backoff_ms))
        metrics.FIRE_ERRORS.labels(reason).inc()
        log.warning(
            "timer cannot fire",
            extra={
                "action": "fire_error",
                "reason": reason,
                "error": error,
                "tenant": timer.tenant_id,
                "service_call_id": timer.service_call_id,
                "attempts": timer.attempts,
                "retry_in_ms": backoff_ms,
            },
        )

    async def _publish(
        self,
        due: list[Claimed],
        now: datetime,
        nexts: dict[Key, tuple[datetime | None, int | None]],
        fired: list[Fired],
        failed: list[Failed],
    ) -> None:
        # First attempts go in atomic batches; an occurrence claimed before may already be in
        # the stream, which would make its whole batch fail, so those go one by one (deduped).
        due = sorted(due, key=lambda c: c.attempts > 1)
        reached, reached_ms = iso(now), round(now.timestamp() * 1000)
        subjects = self.broker.subjects
        ids = self.broker.ids
        messages = [due_event(c, subjects.due(c.tenant_id), reached, reached_ms, ids) for c in due]
        if oversized := self._oversized(messages):
            due, messages = self._deliverable(due, messages, oversized, failed)
        retries = sum(1 for c in due if c.attempts > 1)
        first, again = messages[: len(messages) - retries], messages[len(messages) - retries :]
        timeout = self.s.publish_timeout_ms / 1000
        started = time.perf_counter()
        with tracing.span("timer.publish", **{"timer.count": len(due), "timer.retries": retries}):
            traced = tracing.publish_spans(due, messages)
            # Side by side, within one timeout (held under the lease): one after the other they
            # could outlast it, and Postgres would end the claim's idle session, rolling back
            # every claim, so that the next claim had the same shape again.
            published, republished = await asyncio.gather(
                self.broker.publish_atomic(first, timeout) if first else _no_results(),
                self.broker.publish_many(again, timeout) if again else _no_results(),
            )
            results = [*published, *republished]
            if traced:
                tracing.end_publish_spans(traced, results)
        metrics.PUBLISH_SECONDS.observe(time.perf_counter() - started)
        acked_at = self.clock.now()
        errors = 0
        lateness: list[float] = []
        for timer, err in zip(due, results, strict=True):
            if err is None:
                fired.append(Fired(timer, *nexts[timer.tenant_id, timer.service_call_id]))
                lateness.append(max(0.0, acked_at - timer.due_at.timestamp()))
            else:
                errors += 1
                failed.append((timer, f"publish: {type(err).__name__}: {err}", RETRY_BACKOFF_MS))
        # One call per batch: a histogram's observe per timer was 3 % of a replica's CPU in a drain.
        metrics.observe_many(metrics.LATENESS_SECONDS, lateness)
        metrics.FIRED.inc(len(due) - errors)
        if errors:
            metrics.PUBLISH_FAILED.inc(errors)
            log.warning(
                "publish failed",
                extra={"action": "publish_failed", "count": errors, "error": failed[-1][1]},
            )

    def _oversized(self, messages: list[Outgoing]) -> dict[int, int]:
        """{place: size} of the events the server would refuse for their size (wire_size over its
        max_payload): it would answer MaxPayloadError, or, where nats-py checks the payload alone,
        close the connection. A timer accepted since `data` is measured as delivered never makes
        one (Broker.ensure_streams checks the settings against the server); a row stored before,
        or written by hand, may."""
        limit = self.broker.max_payload
        # Measured whole only where it could be over: an event with its Nats-Msg-Id alone (59
        # bytes of headers) and half the limit of payload is not, so most cost two len()s.
        return {
            i: size
            for i, m in enumerate(messages)
            if len(m.payload) > limit // 2 or len(m.headers) > 1
            if (size := wire_size(m)) > limit
        }

    def _deliverable(
        self,
        due: list[Claimed],
        messages: list[Outgoing],
        oversized: dict[int, int],
        failed: list[Failed],
    ) -> tuple[list[Claimed], list[Outgoing]]:
        """The occurrences and events left once the oversized ones are set aside as broken rows:
        recorded on the row and backed off (its attempts and lastError in `get`, a fire error in
        the metrics), never retried every second as a publish that failed for now."""
        limit = self.broker.max_payload
        for i, size in oversized.items():
            error = f"its event is {size} bytes, more than the NATS server's max_payload {limit}"
            self._cannot_fire(due[i], "event_too_large", error, failed)
        keep = [i for i in range(len(due)) if i not in oversized]
        return [due[i] for i in keep], [messages[i] for i in keep]

    async def _record(self, batch: ClaimedBatch, fired: list[Fired], failed: list[Failed]) -> None:
        """Record what was acknowledged and release what failed, in the claim's transaction.

        Not retried: an error rolls the claim back, its rows free at once for another claim. But
        its firings are out, and a row that looks never claimed would take a command meanwhile (a
        reschedule firing a one-shot timer twice): _record_again records them, then the error goes on."""
        with tracing.span("timer.mark", **{"timer.count": len(fired)}) as span:
            try:
                marked = await batch.record(fired, failed)
            except Exception as exc:
                if fired:
                    await self._record_again(fired, exc)
                raise
            span.set_attribute("timer.marked", marked)
            span.set_attribute("timer.fenced", len(fired) - marked)
        metrics.MARKED.inc(marked)
        if marked < len(fired):
            metrics.FENCE_REJECTED.inc(len(fired) - marked)
            log.warning(
                "lease lost before mark",
                extra={"action": "fence_rejected", "count": len(fired) - marked},
            )

    async def _record_again(self, fired: list[Fired], lost: Exception) -> None:
        """Record acknowledged firings whose claim's transaction was lost (`lost`), each only where
        its row still holds that occurrence, unclaimed (FiringStore.record_again). Once: if this
        fails too (the database gone), another claim fires them again, deduplicated by their
        Nats-Msg-Id, and a command that came first meanwhile applies (docs/RELIABILITY.md)."""
        try:
            marked = await self.store.record_again(fired)
        except Exception as exc:  # the batch's own error is what the loop judges, raised after this
            again = {"count": len(fired), "error": f"{type(exc).__name__}: {exc}"}
            log.warning("record again failed", extra={"action": "record_again_failed", **again})
            return
        metrics.MARKED.inc(marked)
        done = {"count": len(fired), "marked": marked, "error": f"{type(lost).__name__}: {lost}"}
        log.warning("batch recorded again", extra={"action": "recorded_again", **done})
