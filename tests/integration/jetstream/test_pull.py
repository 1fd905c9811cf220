"""The command feed's own pull (worker/adapters/jetstream/pull.py) against a real NATS server: a partial
batch comes at once, a delivery that arrives after its fetch was given up is handed out by
the next one, and an outage does not pile up requests that the server serves at the reconnect."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from tests.helpers import publish_raw, until
from worker.adapters.jetstream import streams
from worker.adapters.jetstream.broker import Broker
from worker.config import Settings
from worker.core.ports import FetchFailed
from worker.devkit.embedded import EmbeddedNats


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
async def test_an_outage_does_not_pile_up_requests_served_at_the_reconnect(
    settings: Settings, embedded_nats: EmbeddedNats | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Intake fetches on through a NATS outage. Each fetch forgot the request before and asked
    # again; nats-py kept them all until the reconnect, and the server, counting their expiry
    # from then, served each a batch at once: several batches waiting in one replica's buffer,
    # their ack wait running (and the other replicas given none of them).
    assert embedded_nats is not None, "stops and restarts NATS: needs the embedded server"
    # Nothing is acknowledged, so that the consumer's "waiting for an ack" counts every delivery;
    # an ack wait longer than the test, so that none is delivered twice.
    monkeypatch.setattr(streams, "ACK_WAIT_S", 300)
    batch, n = 10, 60
    broker = await connected(settings)
    try:
        for i in range(n):
            await publish_raw(broker.js, settings, "acme", "schedule", {"n": i})
        feed = await broker.command_subscription()
        handed = len(await feed.fetch(batch, timeout=10))
        assert handed == batch
        embedded_nats.stop()
        await until(lambda: broker.nc is not None and broker.nc.is_reconnecting, what="the outage seen")
        outage = asyncio.get_running_loop().time() + 6  # the fault: several of a request's lives
        while asyncio.get_running_loop().time() < outage:
            with contextlib.suppress(TimeoutError, FetchFailed):
                handed += len(await feed.fetch(batch, timeout=1.0))
        embedded_nats.start()
        await until(lambda: broker.nc is not None and broker.nc.is_connected, what="reconnected")

        async def over() -> bool:
            return (await waiting_delivered(broker, settings))[1] - handed > batch

        with pytest.raises(TimeoutError):  # a negative check: any such request is served at once
            await until(over, timeout=5, what="more than a batch delivered and not handed out")
        assert handed == batch, "nothing comes during an outage"
        await feed.unsubscribe()
    finally:
        embedded_nats.start()
        await broker.close()
