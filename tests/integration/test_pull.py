"""The command feed's own pull (worker/adapters/pull.py) against a real NATS server: a partial
batch comes at once, a delivery that arrives after its fetch was given up is handed out by
the next one, and a slow link does not make it ask for more than one batch at a time."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from tests.chaos.proxy import Proxy
from tests.helpers import publish_raw, until
from worker.adapters import streams
from worker.adapters.broker import Broker
from worker.config import Settings


async def waiting_delivered(broker: Broker, settings: Settings) -> tuple[int, int]:
    info = await broker.js.consumer_info(settings.command_stream, settings.consumer)
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


def seqs(msgs: Any) -> list[int]:
    return [m.metadata.sequence.stream for m in msgs]


async def connected(settings: Settings) -> Broker:
    broker = Broker(settings)
    await broker.connect()
    await broker.ensure_streams()
    return broker


async def test_a_partial_batch_comes_at_once_not_after_the_wait(settings: Settings) -> None:
    broker = await connected(settings)
    try:
        for i in range(3):
            await publish_raw(broker.js, settings, "acme", "schedule", {"n": i})
        feed = await broker.command_subscription()
        started = time.monotonic()
        msgs = await feed.fetch(1000, timeout=30)
        assert seqs(msgs) == [1, 2, 3]
        # The request ends once it sent what there was, not when its 30 s expire.
        assert time.monotonic() - started < 10
        await feed.unsubscribe()
    finally:
        await broker.close()


async def test_a_late_delivery_of_an_earlier_pull_is_handed_out_by_the_next_fetch(settings: Settings) -> None:
    broker = await connected(settings)
    try:
        feed = await broker.command_subscription()
        # Given up on while its request (30 s) is still out at the server, with nothing to take.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(feed.fetch(10, timeout=30), 0.2)
        await publish_raw(broker.js, settings, "acme", "schedule", {"n": 1})
        # The server sent it to that request: delivered, waiting for an acknowledgement.
        await until(lambda: _equals(waiting_delivered(broker, settings), (0, 1)), what="the late delivery")
        msgs = await feed.fetch(10, timeout=5)
        assert seqs(msgs) == [1]
        await msgs[0].ack_sync()
        await feed.unsubscribe()
    finally:
        await broker.close()


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


@pytest.mark.timeout(180)
async def test_a_slow_link_never_has_more_than_a_batch_delivered_and_not_handed_out(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A round trip longer than a request lives (the fetch's 1 s) and the second after which a
    # request whose end was not heard was taken for lost: a request that was only slow was
    # forgotten and asked again, and the server delivered a batch to each, waiting in the
    # buffer with their ack wait running (and the other replicas given none of them).
    batch, n, one_way_s = 10, 60, 1.2
    # Nothing is acknowledged, so that the consumer's "waiting for an ack" counts every delivery;
    # an ack wait longer than the test, so that none is delivered twice.
    monkeypatch.setattr(streams, "ACK_WAIT_S", 300)
    direct = await connected(settings)
    host, port = settings.nats_url.removeprefix("nats://").split(":")
    with Proxy(host, int(port)) as proxy:
        slow = await connected(settings.model_copy(update={"nats_url": proxy.url_for(settings.nats_url)}))
        try:
            for i in range(n):
                await publish_raw(direct.js, settings, "acme", "schedule", {"n": i})
            feed = await slow.command_subscription()
            proxy.set_latency(one_way_s)
            handed: list[Any] = []
            beyond: list[int] = []  # delivered (never acknowledged) minus handed out, as it goes

            async def sample() -> None:
                while True:
                    beyond.append((await waiting_delivered(direct, settings))[1] - len(handed))
                    await asyncio.sleep(0.02)  # a sampling cadence, not a wait for anything

            sampler = asyncio.create_task(sample())
            try:
                async with asyncio.timeout(120):
                    while len(handed) < n:
                        with contextlib.suppress(TimeoutError):
                            handed += await feed.fetch(batch, timeout=1.0)
            finally:
                sampler.cancel()
            assert seqs(handed) == list(range(1, n + 1))
            assert max(beyond) <= batch, beyond
            proxy.set_latency(0)
            await feed.unsubscribe()
        finally:
            await slow.close()
            await direct.close()
