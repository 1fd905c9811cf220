"""The command stream with limits retention: acknowledged commands purged up to the shared
consumer's ack floor, never one still pending; and the cut-over of a work-queue stream made by an
older release (`timer-service migrate-streams`) while producers and replicas run."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections import Counter
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import api
from prometheus_client import REGISTRY

from tests.helpers import iso_in, jetstream, publish_raw, query, recorder, running_replica, until
from worker.adapters.jetstream.broker import Broker
from worker.adapters.jetstream.streams import SUCCESSOR
from worker.config import Settings
from worker.contract import Subjects
from worker.ops.stream_migration import migrate_streams


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


def commands_taken() -> float:
    """Every valid command a replica of this process took through Store.apply, whatever came of it."""
    return sum(
        REGISTRY.get_sample_value("timer_commands_applied_total", {"kind": k, "outcome": o}) or 0.0
        for k in ("schedule", "cancel")
        for o in ("applied", "ignored", "deferred", "busy")
    )


async def old_release_streams(settings: Settings) -> None:
    """The streams as a release before this one made them: the command stream a work queue."""
    broker = Broker(settings)
    await broker.connect()
    try:
        for config in broker.stream_configs():
            if config.name == settings.command_stream:
                config = dataclasses.replace(config, retention=api.RetentionPolicy.WORK_QUEUE)
            await broker.js.add_stream(config)
    finally:
        await broker.close()


async def test_cut_over_from_a_work_queue_loses_no_command_and_applies_none_twice(
    settings: Settings, db_url: str
) -> None:
    """Two replicas run on a work-queue command stream while a producer sends schedules and
    cancels without pause; migrate-streams cuts over in the middle. Every command reaches the
    replicas exactly once, every timer fires once or (cancelled) never."""
    await old_release_streams(settings)
    new = f"{settings.command_stream}_V2"
    n = 1500
    cancelled = {f"k-{i}" for i in range(0, n, 7)}
    published = 0
    refused = 0  # publishes that met no stream (the cut-over's one request) and were sent again
    moved = asyncio.Event()

    async def produce(js: Any) -> None:
        nonlocal published, refused
        due = iso_in(4, db_url)
        # A cancelled timer is due long after the test: a cancel that reaches intake after its
        # timer was claimed is applied after the firing (README, guarantees), and on a loaded
        # machine intake may lag 4 s. Lost or applied twice, its row would not end Cancelled.
        far = iso_in(3600, db_url)
        for i in range(n):
            if i % 50 == 0:
                due = iso_in(4, db_url)
            key = f"k-{i}"
            when = far if key in cancelled else due
            commands = [("schedule", {"tenantId": "acme", "serviceCallId": key, "dueAt": when})]
            if key in cancelled:
                commands.append(("cancel", {"tenantId": "acme", "serviceCallId": key}))
            sent_ms = int(time.time() * 1000)
            for later, (kind, payload) in enumerate(commands):
                envelope = {
                    "id": f"{key}-{kind}",
                    "type": "ScheduleTimer" if kind == "schedule" else "CancelTimer",
                    "tenantId": "acme",
                    # The cancel is the later command (equal times would let a schedule win the tie).
                    "timestampMs": sent_ms + later,
                    "payload": payload,
                }
                while True:  # a producer retries a failed publish; Nats-Msg-Id drops a copy
                    try:
                        await js.publish(
                            f"{settings.subject_prefix}.acme.timer.{kind}",
                            json.dumps(envelope).encode(),
                            headers={"Nats-Msg-Id": envelope["id"]},
                            timeout=2,
                        )
                        break
                    except (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError):
                        refused += 1
                published += 1
            if i == n // 3:
                moved.set()  # a third sent to the work queue: cut over while the rest comes
            if i % 10 == 0:
                await asyncio.sleep(0.02)  # pacing the load (~500 commands/s), not waiting for anything

    before = commands_taken()
    async with (
        running_replica(settings, worker_id="a") as a,
        running_replica(settings, worker_id="b") as b,
        recorder(settings) as rec,
        jetstream(settings) as js,
    ):
        load = asyncio.create_task(produce(js))
        await moved.wait()
        said: list[str] = []
        assert await migrate_streams(settings, wait=30, say=said.append), said
        await load

        old = await js.stream_info(settings.command_stream)
        assert old.config.subjects == [settings.command_stream]
        assert (old.config.metadata or {})[SUCCESSOR] == new
        successor = await js.stream_info(new)
        assert successor.config.retention == api.RetentionPolicy.LIMITS
        assert successor.config.subjects == Subjects(settings.subject_prefix).commands
        # The work queue came before schedule_many; its successor takes its batches, fast ones too.
        assert successor.config.allow_atomic and successor.config.allow_batched
        # Its sequence numbers continue the old stream's, so they still order a timer's commands.
        assert f"first sequence {old.state.last_seq + 1})" in " ".join(said)
        await until(
            lambda: a.broker.command_stream == new == b.broker.command_stream, what="both replicas moved"
        )

        fire = [f"k-{i}" for i in range(n) if f"k-{i}" not in cancelled]
        await until(lambda: len(rec.keys()) >= len(fire), timeout=60, what="every timer fired")
        await until(lambda: commands_taken() - before >= published, timeout=30, what="every command taken")
        await until(equals(lambda: messages(js, new), 0), timeout=10, what="the new stream purged")
        await until(lambda: a.broker.draining is None and b.broker.draining is None, what="drain noticed")
    assert rec.keys() == Counter(dict.fromkeys((("acme", k) for k in fire), 1))
    assert commands_taken() - before == published  # none twice: no redelivery, no copy
    states = dict(query(db_url, "SELECT service_call_id, state FROM timers"))
    assert {k for k, s in states.items() if s == "Cancelled"} == cancelled
    assert len(states) == n
    print(f"publishes refused during the cut-over and sent again: {refused}")

    # A replica started later, still configured with the old name, follows it too.
    follower = Broker(settings)
    await follower.connect()
    try:
        await follower.ensure_streams()
        assert (follower.command_stream, follower.draining) == (new, None)
    finally:
        await follower.close()
