"""Publishing to JetStream: atomic batches, and what happens when a batch cannot be taken."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from nats.js import api

from worker.broker import ATOMIC_BATCH_MAX, ATOMIC_BATCH_MIN, Broker
from worker.config import Settings
from worker.contract import Outgoing


@pytest.fixture
async def broker(settings: Settings) -> AsyncIterator[Broker]:
    b = Broker(settings)
    await b.connect()
    await b.ensure_streams()
    yield b
    await b.close()


def events(settings: Settings, ids: range, tenant: str = "acme") -> list[Outgoing]:
    subject = f"{settings.subject_prefix}.{tenant}.timer.due"
    return [Outgoing(subject, f'{{"n":{i}}}'.encode(), {"Nats-Msg-Id": f"id-{i}"}) for i in ids]


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
