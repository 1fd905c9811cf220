"""The command stream with limits retention: acknowledged commands purged up to the shared
consumer's ack floor, never one still pending; and the cut-over of a work-queue stream made by an
older release (`timer-service migrate-streams`) while producers and replicas run."""

from __future__ import annotations

import json
from typing import Any

from nats.js import api

from tests.helpers import iso_in, jetstream, publish_raw, query, running_replica, until
from worker.adapters.broker import Broker
from worker.config import Settings


async def messages(js: Any, stream: str) -> int:
    return int((await js.stream_info(stream)).state.messages)


def equals(value: Any, expected: Any) -> Any:
    """An async check for `until`: the awaited `value` equals `expected`."""

    async def check() -> bool:
        return bool(await value() == expected)

    return check


async def test_the_command_stream_is_created_with_limits_retention_and_applied_commands_are_purged(
    settings: Settings, db_url: str
) -> None:
    keys = [f"p-{i}" for i in range(300)]
    async with running_replica(settings), jetstream(settings) as js:
        info = await js.stream_info(settings.command_stream)
        assert info.config.retention == api.RetentionPolicy.LIMITS
        assert info.config.max_age == settings.command_max_age.total_seconds()
        assert info.config.duplicate_window == 120
        consumer = await js.consumer_info(settings.command_stream, settings.consumer)
        assert consumer.config.ack_policy == api.AckPolicy.EXPLICIT
        due = iso_in(3600, db_url)
        for k in keys:
            await publish_raw(
                js, settings, "acme", "schedule", {"tenantId": "acme", "serviceCallId": k, "dueAt": due}
            )
        await until(
            lambda: query(db_url, "SELECT count(*) FROM timers")[0][0] == len(keys), what="every timer stored"
        )
        # The purge runs about once a second: the stream ends up empty, nothing else removes them.
        await until(
            equals(lambda: messages(js, settings.command_stream), 0), timeout=10, what="commands purged"
        )


async def test_purging_keeps_every_command_not_yet_acknowledged(settings: Settings) -> None:
    """Two "replicas" share the consumer; one command is NAKed with a delay (deferred, as intake
    does for a timer being fired), another is still in hand: purges keep both, and everything
    after them, until they are acknowledged."""
    broker = Broker(settings)
    await broker.connect()
    try:
        await broker.ensure_streams()
        js = broker.js
        for i in range(10):
            await publish_raw(js, settings, "acme", "schedule", {"n": i})
        a = await js.pull_subscribe_bind(settings.consumer, settings.command_stream)
        b = await js.pull_subscribe_bind(settings.consumer, settings.command_stream)
        first = await a.fetch(5, timeout=5)
        second = await b.fetch(5, timeout=5)
        assert [m.metadata.sequence.stream for m in first + second] == list(range(1, 11))
        deferred, in_hand = first[2], second[1]  # seqs 3 and 7
        for m in first + second:
            if m is deferred:
                await m.nak(delay=1)  # it stays unacknowledged when redelivered, until acked
            elif m is not in_hand:
                await m.ack_sync()
        await until(
            equals(lambda: _ack_floor(js, settings), 2),
            what="the ack floor stops before the deferred command",
        )
        assert await broker.purge_acknowledged() == 2
        assert await broker.purge_acknowledged() == 0  # floor unchanged: nothing sent, nothing gone
        assert (await js.stream_info(settings.command_stream)).state.first_seq == 3
        assert (
            await messages(js, settings.command_stream) == 8
        )  # 3..10: acknowledged ones above the floor stay

        again = await a.fetch(1, timeout=10)  # the deferred command comes back and is applied
        assert [m.metadata.sequence.stream for m in again] == [3]
        await again[0].ack_sync()
        await until(equals(lambda: _ack_floor(js, settings), 6), what="the floor moves up to the one in hand")
        assert await broker.purge_acknowledged() == 4
        got = await js.get_msg(settings.command_stream, 7)
        assert json.loads(got.data or b"") == {"n": 6}  # the one in hand is still there

        await in_hand.ack_sync()
        await until(equals(lambda: _ack_floor(js, settings), 10), what="everything acknowledged")
        assert await broker.purge_acknowledged() == 4
        assert await messages(js, settings.command_stream) == 0
    finally:
        await broker.close()


async def _ack_floor(js: Any, settings: Settings) -> int:
    info = await js.consumer_info(settings.command_stream, settings.consumer)
    return int(info.ack_floor.stream_seq)
