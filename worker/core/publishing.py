"""One claimed batch fired: each event published when its occurrence comes due on the database clock,
all acknowledged or failed before anything is recorded, then recorded in the claim's transaction."""

from __future__ import annotations

import asyncio
import bisect
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime

from worker import metrics, tracing
from worker.config import Settings
from worker.contract import Outgoing, due_event, iso, wire_size
from worker.core.clock import Clock
from worker.core.crashpoints import crash_point
from worker.core.domain import Claimed, Failed, Fired, Unreadable
from worker.core.expiry import expired_entry, expiring, honour, late_ms, missed
from worker.core.fireable import RETRY_BACKOFF_MS, Nexts, cannot_fire, fireable, next_budget
from worker.core.loop import Loop
from worker.core.ports import ClaimedBatch, EventPublisher, FiringStore
from worker.core.wakeup import Wakeup
from worker.errors import verdict

log = logging.getLogger(__name__)


async def _no_results() -> list[BaseException | None]:
    return []


class BatchFiring(Loop[FiringStore, EventPublisher]):
    """What the firing loop does with each batch it claims (`fire`)."""

    def __init__(
        self, settings: Settings, store: FiringStore, broker: EventPublisher, wakeup: Wakeup, clock: Clock
    ) -> None:
        super().__init__(settings, store, broker, wakeup, clock)
        self.next_budget = next_budget()  # both lanes' batches share it

    async def fire(self, batch: ClaimedBatch) -> None:
        """Publish each occurrence once it is due on the database clock, then record them all; the batch
        ends here."""
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
        waiting, nexts = await fireable(claimed, unreadable, self.next_budget, failed, self.broker.ids)
        fired: list[Fired] = []
        # Each due instant's events go out when it comes, not after the previous instant's PubAcks.
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
                send.cancel()  # after an error or a stop, those still out end too
            await asyncio.gather(*sends, return_exceptions=True)
        crash_point("published")
        await self._record(batch, fired, failed)
        crash_point("marked")
        # A recurring timer's next occurrence was unknown when this claim looked ahead.
        if upcoming := [f.next_due_at for f in fired if f.next_due_at is not None]:
            self.wakeup.hint(min(upcoming).timestamp())

    async def _publish(
        self,
        due: list[Claimed],
        now: datetime,
        nexts: Nexts,
        fired: list[Fired],
        failed: list[Failed],
    ) -> None:
        due, skipped = missed(due)
        due, gone = await self._decided(*expiring(due, now), failed)
        # First attempts go in atomic batches; a re-claimed occurrence may already be in the stream,
        # which would fail its whole batch, so those go one by one, deduplicated.
        due = sorted(due, key=lambda c: c.attempts > 1)
        reached, reached_ms = iso(now), round(now.timestamp() * 1000)
        subjects = self.broker.subjects
        ids = self.broker.ids
        messages = [due_event(c, subjects.due(c.tenant_id), reached, reached_ms, ids) for c in due]
        entries = [
            expired_entry(c, subjects, c.expire_after or "", late_ms(c, now.timestamp()), ids) for c in gone
        ]
        if oversized := self._oversized(messages):
            due, messages = self._deliverable(due, messages, oversized, failed)
        retries = sum(1 for c in due if c.attempts > 1)
        first, again = messages[: len(messages) - retries], messages[len(messages) - retries :]
        timeout = self.s.publish_timeout_ms / 1000
        started = time.perf_counter()
        template = subjects.due("*")  # never one tenant's subject in a span's name
        with tracing.messaging_span(
            "publish",
            template,
            "client",
            {
                "messaging.destination.template": template,
                "messaging.batch.message_count": len(due),
                "timer.retries": retries,
            },
        ):
            traced = tracing.create_spans(due, messages, template)
            # Side by side, within one timeout: in turn they could outlast the claim's idle session.
            published, republished, dead = await asyncio.gather(
                self.broker.publish_atomic(first, timeout) if first else _no_results(),
                self.broker.publish_many(again, timeout) if again else _no_results(),
                self.broker.publish_many(entries, timeout) if entries else _no_results(),
            )
            results = [*published, *republished]
            if traced:
                tracing.end_create_spans(traced, results)
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
        # One call per batch: an observe per timer is costly in a drain.
        metrics.observe_many(metrics.LATENESS_SECONDS, lateness)
        metrics.FIRED.inc(len(due) - errors)
        errors += self._expired(gone, dead, nexts, fired, failed)
        self._skipped(skipped, nexts, fired)
        if errors:
            metrics.PUBLISH_FAILED.inc(errors)
            log.warning(
                "publish failed",
                extra={"action": "publish_failed", "count": errors, "error": failed[-1][1]},
            )

    async def _decided(
        self, due: list[Claimed], gone: list[Claimed], failed: list[Failed]
    ) -> tuple[list[Claimed], list[Claimed]]:
        """(to publish, expired): expiry decisions committed before any is published; those whose
        decision could not be recorded are retried after a back-off, like a failed publish."""
        if not gone and all(c.expire_after is None for c in due):  # nearly always
            return due, gone
        subject = [c for c in due if c.expire_after is not None] + gone
        try:
            expired = await self.store.decide_expiry(
                subject, {(c.tenant_id, c.service_call_id) for c in gone}
            )
        except Exception as exc:  # only fatal ends the loop
            if verdict(exc) == "fatal":
                raise
            error = f"expiry decision: {type(exc).__name__}: {exc}"
            failed += [(c, error, RETRY_BACKOFF_MS) for c in subject]
            metrics.PUBLISH_FAILED.inc(len(subject))
            log.warning(
                "publish failed", extra={"action": "publish_failed", "count": len(subject), "error": error}
            )
            return [c for c in due if c.expire_after is None], []
        return honour(due, gone, expired)

    @staticmethod
    def _expired(
        gone: list[Claimed],
        results: list[BaseException | None],
        nexts: Nexts,
        fired: list[Fired],
        failed: list[Failed],
    ) -> int:
        """Record expired occurrences whose DLQ entry was acknowledged as not fired; retry the others.
        How many failed."""
        errors = 0
        for timer, err in zip(gone, results, strict=True):
            if err is None:
                fired.append(Fired(timer, *nexts[timer.tenant_id, timer.service_call_id], True))
            else:
                errors += 1
                failed.append((timer, f"publish expired: {type(err).__name__}: {err}", RETRY_BACKOFF_MS))
        if expired := len(gone) - errors:
            metrics.EXPIRED.inc(expired)
            oldest = gone[0]
            log.info(
                "occurrences expired",
                extra={
                    "action": "expired",
                    "count": expired,
                    "tenant": oldest.tenant_id,
                    "service_call_id": oldest.service_call_id,
                },
            )
        return errors

    @staticmethod
    def _skipped(skipped: list[Claimed], nexts: Nexts, fired: list[Fired]) -> None:
        """Missed occurrences of catch-up "none" timers: recorded as not fired, each on to its next
        occurrence."""
        if not skipped:
            return
        fired += [Fired(c, *nexts[c.tenant_id, c.service_call_id], True) for c in skipped]
        metrics.CATCHUP_SKIPPED.inc(len(skipped))
        first = skipped[0]
        log.info(
            "missed occurrences skipped",
            extra={
                "action": "catchup_skipped",
                "count": len(skipped),
                "tenant": first.tenant_id,
                "service_call_id": first.service_call_id,
            },
        )

    def _oversized(self, messages: list[Outgoing]) -> dict[int, int]:
        """{place: size} of events over the server's max_payload, which would fail or close the
        connection. Intake bounds new timers; an older or hand-written row may still make one."""
        limit = self.broker.max_payload
        # Measured whole only where it could be over, so most cost two len()s.
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
        """Set oversized events aside as broken rows, recorded and backed off, not retried as a failed
        publish."""
        limit = self.broker.max_payload
        for i, size in oversized.items():
            error = f"its event is {size} bytes, more than the NATS server's max_payload {limit}"
            cannot_fire(due[i], "event_too_large", error, failed)
        keep = [i for i in range(len(due)) if i not in oversized]
        return [due[i] for i in keep], [messages[i] for i in keep]

    async def _record(self, batch: ClaimedBatch, fired: list[Fired], failed: list[Failed]) -> None:
        """Record what was acknowledged and release what failed, in the claim's transaction. Not
        retried: on an error the firings are out but the rows look unclaimed, so _record_again
        records them first."""
        with tracing.span("timer.mark", **{"timer.count": len(fired)}) as span:
            try:
                recorded = await batch.record(fired, failed)
            except Exception as exc:
                if fired:
                    await self._record_again(fired, exc)
                raise
            span.set_attribute("timer.marked", recorded)
            span.set_attribute("timer.fenced", len(fired) - recorded)
        metrics.RECORDED.inc(recorded)
        if recorded < len(fired):
            metrics.FENCE_REJECTED.inc(len(fired) - recorded)
            log.warning(
                "lease lost before record",
                extra={"action": "fence_rejected", "count": len(fired) - recorded},
            )

    async def _record_again(self, fired: list[Fired], lost: Exception) -> None:
        """Record acknowledged firings whose claim was lost, where the row still holds that occurrence.
        Once: if this fails too, another claim fires them again, deduplicated by Nats-Msg-Id."""
        try:
            recorded = await self.store.record_again(fired)
        except Exception as exc:  # the batch's own error is what the loop judges, raised after this
            again = {"count": len(fired), "error": f"{type(exc).__name__}: {exc}"}
            log.warning("record again failed", extra={"action": "record_again_failed", **again})
            return
        metrics.RECORDED.inc(recorded)
        done = {"count": len(fired), "marked": recorded, "error": f"{type(lost).__name__}: {lost}"}
        log.warning("batch recorded again", extra={"action": "recorded_again", **done})
