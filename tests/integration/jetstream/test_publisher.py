"""Publishing to JetStream (worker/adapters/jetstream/publisher.py): atomic batches, and what
happens when a batch cannot be taken."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import nats.errors
import pytest
from nats.js import api
from nats.js.errors import APIError

from tests.helpers import until
from worker.adapters.jetstream.broker import Broker
from worker.adapters.jetstream.publisher import ATOMIC_BATCH_MIN
from worker.client.batches import ATOMIC_BATCH_MAX
from worker.config import Settings
from worker.contract import Outgoing
from worker.devkit.embedded import EmbeddedNats


@pytest.fixture
def broker(streams: Broker) -> Broker:
    return streams


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
    assert broker.publisher.atomic, "a duplicate is no reason to stop batching"


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
        assert not b.publisher.atomic
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


# Fast-ingest batches (nats-server 2.14+, allow_batched): issue 21, item 2.


@pytest.fixture
async def fast(settings: Settings) -> AsyncIterator[Broker]:
    b = Broker(settings.model_copy(update={"events_fast_ingest": "on"}))
    await b.connect()
    await b.ensure_streams()
    yield b
    await b.close()


async def last_headers(broker: Broker, settings: Settings) -> dict[str, str]:
    info = await broker.js.stream_info(settings.event_stream)
    msg = await broker.js.get_msg(settings.event_stream, seq=int(info.state.last_seq))
    return dict(msg.headers or {})


async def test_events_go_in_fast_batches_and_carry_only_their_own_headers(
    fast: Broker, settings: Settings
) -> None:
    assert fast.publisher.fast, "TIMER_EVENTS_FAST_INGEST=on on nats-server 2.14+ publishes fast batches"
    n = ATOMIC_BATCH_MAX + 3
    sent = events(settings, range(n))
    assert await fast.publish_atomic(sent, timeout=5) == [None] * n
    assert await stored(fast, settings) == n
    # An atomic batch stores Nats-Batch-Id, -Sequence and -Commit with every event as well.
    assert await last_headers(fast, settings) == {"Nats-Msg-Id": f"id-{n - 1}"}


async def test_a_duplicate_in_a_fast_batch_is_skipped_not_the_batch(
    fast: Broker, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await fast.publish_atomic(events(settings, range(5, 7)), timeout=5) == [None, None]
    one_by_one: list[int] = []
    send_many = fast.publish_many

    async def spy(messages: list[Outgoing], timeout: float) -> list[BaseException | None]:
        one_by_one.append(len(messages))
        return await send_many(messages, timeout)

    monkeypatch.setattr(fast, "publish_many", spy)
    results = await fast.publish_atomic(events(settings, range(10)), timeout=5)
    assert results == [None] * 10, "a stored Nats-Msg-Id counts as stored"
    assert await stored(fast, settings) == 10
    assert one_by_one == [], "nothing had to go again one by one"


async def test_a_refused_event_fails_alone_and_the_rest_of_its_fast_batch_is_stored(
    settings: Settings,
) -> None:
    b = Broker(settings.model_copy(update={"events_fast_ingest": "on"}))
    await b.connect()
    await b.ensure_streams()
    # Smaller than any event after start-up, which refuses such a stream (check_sizes).
    config = b.stream_configs()[1]
    config.max_msg_size = 200
    await b.js.update_stream(config)
    try:
        assert b.publisher.fast
        sent = events(settings, range(6))
        sent[2] = events(settings, range(2, 3), payload=b"x" * 300)[0]
        results = await b.publish_atomic(sent, timeout=5)
        assert [r is None for r in results] == [True, True, False, True, True, True]
        assert "maximum" in str(results[2]).lower()
        assert await stored(b, settings) == 5
    finally:
        await b.close()


async def test_an_events_stream_without_allow_batched_is_left_alone_and_gets_atomic_batches(
    settings: Settings,
) -> None:
    b = Broker(settings.model_copy(update={"events_fast_ingest": "on"}))
    await b.connect()
    config = b.stream_configs()[1]
    config.allow_batched = False
    await b.js.add_stream(config)
    await b.ensure_streams()
    try:
        assert not b.publisher.fast
        info = await b.js.stream_info(settings.event_stream)
        assert not info.config.allow_batched, "an existing stream is never rewritten"
        n = ATOMIC_BATCH_MIN
        assert await b.publish_atomic(events(settings, range(n)), timeout=5) == [None] * n
        assert "Nats-Batch-Id" in await last_headers(b, settings)
    finally:
        await b.close()


async def test_fast_ingest_off_after_its_flag_is_taken_away(fast: Broker, settings: Settings) -> None:
    info = await fast.js.stream_info(settings.event_stream)
    info.config.allow_batched = False
    await fast.js.update_stream(info.config)
    n = 20
    assert await fast.publish_atomic(events(settings, range(n)), timeout=5) == [None] * n
    assert not fast.publisher.fast
    assert await stored(fast, settings) == n


async def test_a_refused_publish_is_a_result_not_an_exception(settings: Settings) -> None:
    # nats-py's APIError.from_error raises: one refused event took publish_many down with it.
    b = Broker(settings)
    await b.connect()
    await b.ensure_streams()
    # Smaller than any event after start-up, which refuses such a stream (check_sizes).
    config = b.stream_configs()[1]
    config.max_msg_size = 200
    await b.js.update_stream(config)
    try:
        sent = [*events(settings, range(2)), *events(settings, range(2, 3), payload=b"x" * 300)]
        results = await b.publish_many(sent, timeout=5)
        assert results[:2] == [None, None]
        assert isinstance(results[2], APIError)
    finally:
        await b.close()
