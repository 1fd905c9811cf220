"""Batches that are not full in flight beside the next claim (firing.CLAIM_SPACING_S), on real
Postgres and NATS: a stop and a hard stop with two of them held at their PubAcks, on the
smallest pool a replica may have; and the database clock's estimate from a claim's arrival
(Store.claim's `received`), checked against the database's own clock."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import psycopg
import pytest

from tests.helpers import query, recorder, running_replica, until
from worker.adapters.postgres.store import Store
from worker.client import TimerClient
from worker.config import Settings
from worker.contract import Outgoing
from worker.core.clock import DbClock
from worker.core.domain import ClaimParams, Key
from worker.core.firing import PIPELINE_DEPTH
from worker.core.ports import ClaimedBatch
from worker.service import Replica

TIMERS = 200
SPACING_S = 0.01  # one due every 10 ms: no claim is ever full, and windows overlap
# The first comes due this long after it is sent: stored by then on a loaded machine too, so
# that the claims take the trickle in windows rather than all at once, overdue.
LEAD_S = 2.0


@dataclass
class Held:
    """A replica whose PubAcks wait for `release`; `taken`: what each claim that took rows took."""

    replica: Replica
    release: asyncio.Event = field(default_factory=asyncio.Event)
    taken: list[set[Key]] = field(default_factory=list)
    on_the_wire: set[Key] = field(default_factory=set)


def key_of(message: Outgoing) -> Key:
    payload = json.loads(message.payload)["payload"]
    return payload["tenantId"], payload["serviceCallId"]


@contextlib.asynccontextmanager
async def held_replica(settings: Settings) -> AsyncIterator[tuple[Held, asyncio.Task[int]]]:
    held = Held(Replica(settings))
    claim, publish_atomic = held.replica.store.claim, held.replica.broker.publish_atomic

    async def claim_noted(params: ClaimParams) -> ClaimedBatch:
        batch = await claim(params)
        if batch.result.claimed:
            held.taken.append({(c.tenant_id, c.service_call_id) for c in batch.result.claimed})
        return batch

    async def held_publish(messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        held.on_the_wire |= {key_of(m) for m in messages}
        await held.release.wait()
        return await publish_atomic(messages, timeout)

    held.replica.store.claim = claim_noted  # type: ignore[method-assign]
    held.replica.broker.publish_atomic = held_publish  # type: ignore[method-assign]
    task = asyncio.create_task(held.replica.run(handle_signals=False))
    try:
        await until(lambda: held.replica.started.is_set() or task.done(), what="replica start")
        yield held, task
    finally:
        held.release.set()
        held.replica.stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)


async def schedule_trickle(settings: Settings, db_url: str) -> dict[str, float]:
    """TIMERS one-shot timers, one due every SPACING_S from LEAD_S on (the database's clock)."""
    (db_now,) = query(db_url, "SELECT clock_timestamp()")[0]
    first = db_now + timedelta(seconds=LEAD_S)
    due = {f"sc-{i}": first + timedelta(seconds=SPACING_S * i) for i in range(TIMERS)}
    async with await TimerClient.connect(settings.nats_url, settings.subject_prefix) as client:
        sent = await client.schedule_many(
            [{"tenantId": "acme", "serviceCallId": k, "dueAt": d} for k, d in due.items()]
        )
    assert all(s.outcome == "accepted" for s in sent), sent[:3]
    await until(lambda: query(db_url, "SELECT count(*) FROM timers")[0][0] == TIMERS, what="all stored")
    return {k: d.timestamp() for k, d in due.items()}


def states(db_url: str) -> dict[str, tuple[str, str | None]]:
    rows = query(db_url, "SELECT service_call_id, state, lease_owner FROM timers")
    return {sc: (state, owner) for sc, state, owner in rows}


async def two_batches_held(held: Held) -> None:
    """Until two claims that took rows are out, both with occurrences held at their PubAck."""

    def both_on_the_wire() -> bool:
        return len(held.taken) >= PIPELINE_DEPTH and all(
            not held.taken[i].isdisjoint(held.on_the_wire) for i in range(PIPELINE_DEPTH)
        )

    await until(both_on_the_wire, timeout=30, what="two batches held at their PubAcks")


async def test_a_stop_with_two_batches_held_at_their_pubacks_ends_both_and_claims_no_more(
    settings: Settings, db_url: str
) -> None:
    """On the smallest pool: the stop waits for both batches, nothing is recorded before its
    PubAck, exactly what the two claims took is Reached, and the rest is left unclaimed for the
    next replica, which fires it: each timer once, none early."""
    s = settings.model_copy(update={"db_pool_size": 4})
    async with contextlib.AsyncExitStack() as stack:
        async with held_replica(s) as (held, task):
            rec = await stack.enter_async_context(recorder(s))  # once the replica made the streams
            due = await schedule_trickle(s, db_url)
            await two_batches_held(held)
            held.replica.stop.set()
            with pytest.raises(TimeoutError):  # held by its batches, as it must be
                await asyncio.wait_for(asyncio.shield(task), timeout=0.5)
            assert [st for st, _ in states(db_url).values() if st != "Scheduled"] == [], (
                "recorded before its PubAck"
            )
            assert len(held.taken) == PIPELINE_DEPTH
            claimed = {sc for taken in held.taken for _, sc in taken}
            held.release.set()
            assert await asyncio.wait_for(task, timeout=30) == 0
        assert len(held.taken) == PIPELINE_DEPTH, "a claim after the stop"
        after = states(db_url)
        assert {sc for sc, (st, _) in after.items() if st == "Reached"} == claimed
        assert all(owner is None for st, owner in after.values() if st == "Scheduled")
        async with running_replica(s):
            assert await rec.wait_for(TIMERS, timeout=60)
        await until(lambda: len(rec.firings) >= TIMERS, what="every event received")
    assert rec.keys() == {("acme", sc): 1 for sc in due}
    assert [f.service_call_id for f in rec.firings if f.reached_at < f.due_at] == [], "fired early"


async def test_a_hard_stop_with_two_batches_held_at_their_pubacks_marks_nothing(
    settings: Settings, db_url: str
) -> None:
    """With no drain time the loops are cancelled at once: neither batch publishes or records
    anything, their claims stay until the lease runs out, and the next replica fires every timer
    once (the events that did go out are the same messages, deduplicated)."""
    s = settings.model_copy(update={"db_pool_size": 4, "drain_timeout_ms": 0, "lease_ms": 1000})
    async with contextlib.AsyncExitStack() as stack:
        async with held_replica(s) as (held, task):
            rec = await stack.enter_async_context(recorder(s))  # once the replica made the streams
            due = await schedule_trickle(s, db_url)
            await two_batches_held(held)
            claimed = {sc for taken in held.taken for _, sc in taken}
            held.replica.stop.set()
            assert await asyncio.wait_for(task, timeout=10) == 0
        after = states(db_url)
        assert [st for st, _ in after.values() if st != "Scheduled"] == [], "recorded without its PubAck"
        assert {sc for sc, (_, owner) in after.items() if owner is not None} == claimed
        assert len(rec.firings) == 0
        async with running_replica(s):
            assert await rec.wait_for(TIMERS, timeout=60)
        await until(lambda: len(rec.firings) >= TIMERS, what="every event received")
    assert rec.keys() == {("acme", sc): 1 for sc in due}
    assert [f.service_call_id for f in rec.firings if f.reached_at < f.due_at] == [], "fired early"


async def test_the_estimate_from_a_claims_arrival_never_leads_the_database_clock(
    store: Store, db_url: str
) -> None:
    """Claims that take a hundred rows each (their rows read after the reading arrived), one
    batch left open beside the next as the loop does: right after each, the estimate is not
    ahead of a reading of clock_timestamp() taken after it."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
        " SELECT 'acme', 'sc-' || i, 'Scheduled', clock_timestamp() - interval '1 second',"
        " clock_timestamp() - interval '1 second' FROM generate_series(1, 1000) AS i",
    )
    params = ClaimParams(
        owner="t", limit=100, fresh_limit=0, lease_ms=60_000, ahead_ms=100,
        fresh_window_ms=2000, downtime_ms=60_000,
    )  # fmt: skip
    clock = DbClock()
    held: list[ClaimedBatch] = []
    taken = 0
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as probe:
        for _ in range(12):  # ten that take a hundred, then empty ones
            batch = await store.claim(params)
            clock.observe(batch.result.db_now, batch.result.received)
            estimate = clock.now()
            cur = await probe.execute("SELECT clock_timestamp()")
            row = await cur.fetchone()
            assert row is not None
            lead_ms = (estimate - row[0].timestamp()) * 1000
            assert lead_ms <= 0, f"the estimate led the database clock by {lead_ms:.3f} ms"
            taken += len(batch.result.claimed)
            held.append(batch)
            if len(held) == PIPELINE_DEPTH:  # the store's pool holds two: one open, one claiming
                await held.pop(0).close()
        for batch in held:
            await batch.close()
    assert taken == 1000
