"""Publishing to JetStream: atomic batches, and what happens when a batch cannot be taken."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats.errors
import pytest
from nats.js import api

from tests.helpers import until
from worker.adapters.broker import ATOMIC_BATCH_MAX, ATOMIC_BATCH_MIN, Broker
from worker.config import Settings
from worker.contract import Outgoing
from worker.devkit.embedded import EmbeddedNats


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    b = Broker(settings)
    await b.connect()
    await b.ensure_streams()
    yield b
    await b.close()


def events(settings: Settings, ids: range, tenant: str = "acme", payload: bytes = b"") -> list[Outgoing]:
    subject = f"{settings.subject_prefix}.{tenant}.timer.due"
    return [Outgoing(subject, f'{{"n":{i}}}'.encode() + payload, {"Nats-Msg-Id": f"id-{i}"}) for i in ids]


async def stored(broker: Broker, settings: Settings) -> int:
    info = await broker.js.stream_info(settings.event_stream)
    return int(info.state.messages)


async def test_batches_larger_than_the_server_limit_are_split(broker: Broker, settings: Settings) -> None:
    n = ATOMIC_BATCH_MAX * 2 + 7
    results = await broker.publish_atomic(events(settings, range(n)), timeout=5)
    assert results == [None] * n
    assert await stored(broker, settings) == n


async def test_a_batch_with_an_id_already_stored_is_sent_one_by_one(
    broker: Broker, settings: Settings
) -> None:
    # The stream refuses the whole batch (duplicate Nats-Msg-Id); one by one, the stored one is
    # dropped by the duplicate window and the rest are stored: each exactly once.
    n = ATOMIC_BATCH_MIN * 2
    assert await broker.publish_atomic(events(settings, range(5, 6)), timeout=5) == [None]
    results = await broker.publish_atomic(events(settings, range(n)), timeout=5)
    assert results == [None] * n
    assert await stored(broker, settings) == n
    assert broker._atomic, "a duplicate is no reason to stop batching"


async def test_a_stream_without_atomic_batches_still_gets_every_event(settings: Settings) -> None:
    b = Broker(settings)
    await b.connect()
    await b.js.add_stream(
        api.StreamConfig(name=settings.event_stream, subjects=[b.subjects.due("*")], duplicate_window=120)
    )
    await b.ensure_streams()  # leaves the existing stream as its owner made it
    try:
        n = ATOMIC_BATCH_MIN
        assert await b.publish_atomic(events(settings, range(n)), timeout=5) == [None] * n
        assert await b.publish_atomic(events(settings, range(n, 2 * n)), timeout=5) == [None] * n
        assert await stored(b, settings) == 2 * n
        assert not b._atomic
    finally:
        await b.close()


def free_permits(broker: Broker) -> int:
    return broker.permits._value


@pytest.mark.timeout(60)  # a lost permit made publishing hang for good, cancellation and all
async def test_a_full_outbound_buffer_in_an_outage_gives_back_every_permit(
    settings: Settings, embedded_nats: EmbeddedNats | None
) -> None:
    # While NATS is down nats-py buffers publishes; once its buffer (2 MiB) is full a publish
    # raises. Each such publish used to keep its permit, and after TIMER_MAX_IN_FLIGHT of them
    # every publish waited forever, NATS back or not; an atomic batch let the error escape.
    assert embedded_nats is not None, "stops and restarts NATS: needs the embedded server"
    permits = ATOMIC_BATCH_MIN
    b = Broker(settings.model_copy(update={"max_in_flight": permits}))
    await b.connect()
    await b.ensure_streams()
    try:
        embedded_nats.stop()
        await until(lambda: not b.connected, what="the broker sees NATS gone")
        for first in (0, permits):  # 3 MB each: the buffer fills in the first round
            big = events(settings, range(first, first + permits), payload=b"x" * 30_000)
            results = await asyncio.wait_for(b.publish_many(big, timeout=0.5), timeout=10)
            assert all(r is not None for r in results)
        assert all(isinstance(r, nats.errors.OutboundBufferLimitError) for r in results)
        batch = events(settings, range(2 * permits, 3 * permits), payload=b"x" * 30_000)
        results = await asyncio.wait_for(b.publish_atomic(batch, timeout=0.5), timeout=10)
        assert all(isinstance(r, nats.errors.OutboundBufferLimitError) for r in results)
        assert free_permits(b) == permits
        embedded_nats.start()
        await until(lambda: b.connected, what="the broker reconnected")
        n = 3 * permits  # each permit must come back for the next publishes
        results = await asyncio.wait_for(
            b.publish_many(events(settings, range(1000, 1000 + n)), timeout=5), 10
        )
        assert results == [None] * n
        assert free_permits(b) == permits
    finally:
        embedded_nats.start()
        await b.close()


@pytest.mark.timeout(60)
async def test_waiting_for_a_permit_ends_with_the_publish_timeout(broker: Broker, settings: Settings) -> None:
    held = broker.settings.max_in_flight
    for _ in range(held):  # every permit taken, as by publishes whose PubAck never comes
        await broker.permits.acquire()
    try:
        started = time.monotonic()
        results = await asyncio.wait_for(broker.publish_many(events(settings, range(3)), timeout=0.3), 10)
        assert time.monotonic() - started < 1.0
        assert all(isinstance(r, TimeoutError) for r in results)
    finally:
        for _ in range(held):
            broker.permits.release()
