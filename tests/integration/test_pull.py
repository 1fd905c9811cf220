"""The command feed's own pull (worker/adapters/pull.py) against a real NATS server: a partial
batch comes at once, and a delivery that arrives after its fetch was given up is handed out by
the next one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tests.helpers import publish_raw, until
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
