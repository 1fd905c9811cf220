"""A claim batch's transaction on a bad day: its session ended after the PubAck, a slow NATS, a
command deferred behind it. Each test failed before its fix (an adversarial review of one
transaction per claim batch, issue 21)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

import pytest

from tests.chaos.proxy import Proxy
from tests.helpers import (
    commands_applied,
    insert_due,
    iso_in,
    jetstream,
    publish_raw,
    query,
    row,
    running_replica,
    until,
)
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.contract import Outgoing, PauseTimers
from worker.core.domain import ClaimParams, Fired, Position
from worker.core.ports import ClaimedBatch
from worker.core.recurrence import next_of
from worker.service import Replica

# Whatever its outcome: that intake took the command is what counts.
OUTCOMES = ("applied", "ignored", "deferred", "busy", "stuck", "partial")


@contextlib.asynccontextmanager
async def first_batch_lost_after_its_puback(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[asyncio.Event, asyncio.Event]]:
    """A running replica whose first batch's session is ended right after its PubAck, and waited
    for until gone (pg_terminate_backend only signals it): its claim is rolled back. Yields
    (died, claims_open): once died is set, the replica's claims wait for claims_open."""
    replica = Replica(settings.model_copy(update={"lease_ms": 10_000}))
    died, claims_open = asyncio.Event(), asyncio.Event()
    publish_atomic = replica.broker.publish_atomic
    claim = replica.store.claim

    async def gated(params: ClaimParams) -> ClaimedBatch:
        if died.is_set():  # the next claim comes after the reschedule: a poll interval's wait
            await claims_open.wait()
        return await claim(params)

    async def dies_after_puback(messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        results = await publish_atomic(messages, timeout)
        if not died.is_set():
            assert results == [None] * len(messages)
            killed = query(
                db_url,
                "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND state LIKE 'idle in transaction%%'",
            )
            assert len(killed) == 1, "the batch's session was not found: nothing was tested"
            await until(
                lambda: query(db_url, "SELECT 1 FROM pg_stat_activity WHERE pid = %s", killed[0][0]) == [],
                what="the batch's session to end",
            )
            died.set()
        return results

    monkeypatch.setattr(replica.store, "claim", gated)
    monkeypatch.setattr(replica.broker, "publish_atomic", dies_after_puback)
    task = asyncio.create_task(replica.run(handle_signals=False))
    try:
        await until(lambda: replica.started.is_set(), what="replica start")
        yield died, claims_open
    finally:
        claims_open.set()
        replica.stop.set()
        await asyncio.wait_for(task, timeout=30)


async def events_stored(settings: Settings) -> int:
    async with jetstream(settings) as js:
        return (await js.stream_info(settings.event_stream)).state.messages


async def test_a_reschedule_after_a_batch_rolled_back_past_its_puback_does_not_fire_a_one_shot_twice(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch's session ends after the PubAck (a dropped connection, a failover, the idle
    timeout on a slow publish): Postgres rolls the claim back, and the row looks as if the timer
    had never been claimed, though its event is out. A ScheduleTimer that arrives then, before the
    next claim, must not make the one-shot timer fire a second time at the new dueAt (README,
    States: a reschedule once the timer is claimed is ignored for a one-shot timer).

    The replica records the acknowledged firing again at once, in a transaction of its own
    (FiringLoop._record_again): the reschedule, sent once the session is gone and that record
    is in, meets a Reached timer. Claims stay shut until intake has taken it, so a timer left
    Scheduled by the rollback could only be claimed again after the reschedule."""
    async with first_batch_lost_after_its_puback(settings, db_url, monkeypatch) as (died, claims_open):
        insert_due(db_url, "once")
        await until(died.is_set, what="the event published and its batch's session ended")
        # Claims are shut: only the record in a transaction of its own can make it Reached.
        await until(
            lambda: row(db_url, "acme", "once")["state"] == "Reached",  # type: ignore[index]
            what="the acknowledged firing recorded again after the rollback",
        )
        reached = row(db_url, "acme", "once")
        before = commands_applied("schedule", *OUTCOMES)
        async with jetstream(settings) as js:
            body = {"tenantId": "acme", "serviceCallId": "once", "dueAt": iso_in(2, db_url)}
            await publish_raw(js, settings, "acme", "schedule", body)
        await until(
            lambda: commands_applied("schedule", *OUTCOMES) > before, what="intake to take the reschedule"
        )
        claims_open.set()
        assert row(db_url, "acme", "once") == reached  # Reached is final: the reschedule was ignored
    events = await events_stored(settings)
    assert events == 1, f"a one-shot timer fired {events} times (its old dueAt, then the new one)"


async def test_a_recurring_timer_whose_batch_rolled_back_past_its_puback_moves_on_once(
    settings: Settings, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the same path, with claims shut, a recurring timer's next occurrence is stored
    once: the row holds occurrence 1, an hour after the first, fired once, unleased. (A second
    publish of occurrence 0 would be deduplicated, so the row, not the stream, is the proof.)"""
    async with first_batch_lost_after_its_puback(settings, db_url, monkeypatch) as (died, claims_open):
        query(
            db_url,
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
            " VALUES ('acme', 'tick', 'Scheduled', now() - interval '1 s', now() - interval '1 s', 'PT1H')",
        )
        await until(died.is_set, what="the event published and its batch's session ended")
        await until(
            lambda: row(db_url, "acme", "tick")["occurrence_index"] == 1,  # type: ignore[index]
            what="the acknowledged firing recorded again after the rollback",
        )
        claims_open.set()
    stored = row(db_url, "acme", "tick")
    assert stored is not None
    assert (stored["state"], stored["fired_count"], stored["attempts"], stored["lease_owner"]) == (
        "Scheduled",
        1,
        0,
        None,
    )
    assert stored["due_at"] == stored["anchor_due_at"] + timedelta(hours=1)
    assert await events_stored(settings) == 1


async def test_a_batch_whose_every_publish_beats_the_publish_timeout_is_recorded(
    settings: Settings, db_url: str
) -> None:
    """The publish timeout is held below the lease (Settings) so that a batch's session is idle in
    its transaction for less than the lease (adapters/postgres/db.py). But a batch publishes its first
    attempts and its retries in two calls, one after the other, each given the whole timeout: on
    a slow NATS (every PubAck within the timeout) the session outlives the lease, Postgres ends it,
    and the claim rolls back, attempts included, so the next claim has the same shape again."""
    lease_ms, publish_timeout_ms, one_way_s = 1000, 900, 0.3  # a PubAck in ~0.6 s: well within the timeout
    host, port = settings.nats_url.removeprefix("nats://").split(":")
    with Proxy(host, int(port)) as proxy:
        slow: dict[str, Any] = {
            "nats_url": proxy.url_for(settings.nats_url),
            "lease_ms": lease_ms,
            "publish_timeout_ms": publish_timeout_ms,
        }
        async with running_replica(settings, **slow):
            proxy.set_latency(one_way_s)
            # One statement, so one claim takes both: a first attempt, and a retry whose previous
            # claim's lease (a stop) ran out.
            query(
                db_url,
                "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, attempts,"
                " lease_owner, lease_token, lease_expires_at)"
                " VALUES ('acme', 'first', 'Scheduled', %s, %s, 0, NULL, NULL, NULL),"
                " ('acme', 'retry', 'Scheduled', %s, %s, 1, 'gone', 1, now() - interval '1 s')",
                *[iso_in(-1, db_url)] * 4,
            )
            await until(
                lambda: query(db_url, "SELECT count(*) FROM timers WHERE state = 'Reached'") == [(2,)],
                timeout=30,
                what="both timers recorded Reached (every publish acknowledged within the timeout)",
            )


async def test_a_timers_pause_deferred_behind_a_batch_in_flight_does_not_undo_its_later_resume(
    db_url: str,
) -> None:
    """A timer's pauses and resumes apply in stream order (README, Pause and resume). A Pause of a
    recurring timer whose occurrence a batch in flight holds is deferred (pause_timer: `claimed`);
    the Resume after it, delivered once that batch is recorded, finds nothing paused. When the
    Pause comes back (its NAK delay), it must not pause the timer again: the last word was Resume."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " VALUES ('acme', 'tick', 'Scheduled', now() - interval '1 s', now() - interval '1 s', 'PT1H')",
    )
    async with db.pool(db_url, "review", min_size=1, max_size=2, idle_in_transaction_ms=60_000) as pool:
        store = Store(pool)
        batch = await store.claim(ClaimParams("firing", 10, 2, 10_000, 0, 2000, 60_000))
        (held,) = batch.result.claimed
        (stored_at,) = query(db_url, "SELECT now()")[0]
        pause, resume = PauseTimers("acme", "tick", resume=False), PauseTimers("acme", "tick", resume=True)
        assert (await store.pause(pause, Position(10, stored_at))).outcomes == ["deferred"]
        assert await batch.record([Fired(held, *next_of(held))], []) == 1
        await store.pause(resume, Position(11, stored_at))  # nothing to resume yet: ignored
        await store.pause(pause, Position(10, stored_at))  # the deferred Pause, redelivered
    assert query(db_url, "SELECT state, paused_at IS NOT NULL FROM timers") == [("Scheduled", False)]
