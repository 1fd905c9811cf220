"""Streams and the consumer going missing under a running replica, and streams whose own limits
break a guarantee."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections import Counter
from typing import Any

import nats.js.errors
import pytest
from nats.js import api

from tests.helpers import iso_in, jetstream, publish_raw, recorder, row, running_replica, settings_env, until
from worker.adapters.jetstream.broker import Broker
from worker.config import Settings
from worker.core.eventsize import largest_event
from worker.devkit.harness import replica_env
from worker.errors import ConfigError
from worker.service import Replica


async def send(js: Any, settings: Settings, db_url: str, keys: list[tuple[str, str]]) -> None:
    """ScheduleTimers for `keys`, 20 every 0.1 s, each due a second after it is sent: a steady load."""
    for i in range(0, len(keys), 20):
        due = iso_in(1, db_url)
        for tenant, sc in keys[i : i + 20]:
            body = {"tenantId": tenant, "serviceCallId": sc, "dueAt": due}
            await publish_raw(js, settings, tenant, "schedule", body)
        await asyncio.sleep(0.1)  # pacing the load, not waiting for anything


async def exists(js: Any, stream: str) -> bool:
    try:
        await js.stream_info(stream)
        return True
    except nats.js.errors.NotFoundError:
        return False


async def test_a_deleted_consumer_is_recreated_and_no_command_is_lost(
    settings: Settings, db_url: str
) -> None:
    keys = [(f"t{i % 3}", f"c-{i}") for i in range(400)]
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        load = asyncio.create_task(send(js, settings, db_url, keys))
        await until(lambda: len(rec.keys()) >= 40, what="timers firing")
        await js.delete_consumer(settings.command_stream, settings.consumer)
        await load
        await until(lambda: len(rec.keys()) >= len(keys), timeout=60, what="every timer fired")
        await js.consumer_info(settings.command_stream, settings.consumer)
    assert rec.keys() == Counter(dict.fromkeys(keys, 1))


async def test_a_deleted_event_stream_is_recreated_and_firing_resumes(
    settings: Settings, db_url: str
) -> None:
    before = [("acme", f"a-{i}") for i in range(100)]
    after = [("acme", f"b-{i}") for i in range(300)]
    async with running_replica(settings), jetstream(settings) as js:
        async with recorder(settings) as rec:
            await send(js, settings, db_url, before)
            await until(lambda: len(rec.keys()) >= len(before), what="the first timers fired")
        await js.delete_stream(settings.event_stream)
        load = asyncio.create_task(send(js, settings, db_url, after))  # due with no stream to take them
        await until(lambda: exists(js, settings.event_stream), what="the event stream recreated")
        await load
        async with recorder(settings) as rec:  # the new stream, from its start
            await until(lambda: len(rec.keys()) >= len(after), timeout=60, what="the later timers fired")
            assert rec.keys() == Counter(dict.fromkeys(after, 1))


async def test_without_create_streams_readiness_names_the_missing_stream(
    settings: Settings, db_url: str
) -> None:
    replica = Replica(settings.model_copy(update={"create_streams": False}))
    run = asyncio.create_task(replica.run(handle_signals=False))
    owner = Broker(settings)  # the operator, who creates streams by hand
    await owner.connect()

    async def ready_says(text: str) -> bool:
        return (await replica.ready())[1] == text

    try:
        missing = f"stream {settings.command_stream} does not exist (TIMER_CREATE_STREAMS=false)"
        await until(lambda: ready_says(missing), what="readiness naming the missing command stream")
        await owner.ensure_streams()
        await until(lambda: ready_says("ok"), timeout=30, what="ready once the streams exist")

        await owner.js.delete_stream(settings.event_stream)
        async with jetstream(settings) as js:
            body = {"tenantId": "acme", "serviceCallId": "late", "dueAt": iso_in(0, db_url)}
            await publish_raw(js, settings, "acme", "schedule", body)
            missing = f"stream {settings.event_stream} does not exist (TIMER_CREATE_STREAMS=false)"
            await until(lambda: ready_says(missing), what="readiness naming the missing event stream")
            assert not await exists(js, settings.event_stream), "not the replica's to create"
        await owner.ensure_streams()
        await until(lambda: ready_says("ok"), what="ready again")
        await until(lambda: (row(db_url, "acme", "late") or {}).get("state") == "Reached", what="fired")
    finally:
        replica.stop.set()
        assert await asyncio.wait_for(run, timeout=30) == 0
        await owner.close()


async def test_an_event_stream_with_a_short_duplicate_window_stops_start_up(settings: Settings) -> None:
    async with jetstream(settings) as js:
        subjects = [f"{settings.subject_prefix}.*.timer.due"]
        await js.add_stream(
            api.StreamConfig(name=settings.event_stream, subjects=subjects, duplicate_window=5)
        )
    env = replica_env(settings_env(settings), "short-window")
    cmd = [sys.executable, "-m", "worker", "run"]
    done = await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, timeout=30)
    assert done.returncode == 2
    stderr = done.stderr.decode()
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == (
        f"timer-service: stream {settings.event_stream}: duplicate window 5s must exceed TIMER_LEASE_MS"
        " + 3 x TIMER_PUBLISH_TIMEOUT_MS (9s), or a re-fired timer is published twice"
    )


async def test_an_event_stream_too_small_for_the_largest_event_stops_start_up(settings: Settings) -> None:
    # TIMER_MAX_PAYLOAD_BYTES lets a timer's event reach about 40 KB here (16 KiB of data, the
    # longest ids, labels and headers): a stream that refuses messages past 40,000 bytes would refuse it,
    # and the timer would never fire. The one line names the setting and what would fit.
    async with jetstream(settings) as js:
        subjects = [f"{settings.subject_prefix}.*.timer.due"]
        await js.add_stream(
            api.StreamConfig(
                name=settings.event_stream, subjects=subjects, duplicate_window=120, max_msg_size=40000
            )
        )
    env = replica_env(settings_env(settings), "small-stream")
    cmd = [sys.executable, "-m", "worker", "run"]
    done = await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, timeout=30)
    assert done.returncode == 2
    stderr = done.stderr.decode()
    assert "Traceback" not in stderr
    largest = largest_event(settings.max_payload_bytes, set())
    assert stderr.strip().splitlines()[-1] == (
        f"timer-service: TIMER_MAX_PAYLOAD_BYTES=16384 lets a DueTimeReached event reach {largest} bytes,"
        f" more than stream {settings.event_stream}'s max_msg_size (40000): set it to at most"
        f" {16384 - (largest - 40000)}"
    )


async def test_a_command_stream_keeping_commands_past_the_retention_stops_start_up(
    settings: Settings,
) -> None:
    async with jetstream(settings) as js:
        await js.add_stream(
            api.StreamConfig(
                name=settings.command_stream,
                subjects=[
                    f"{settings.subject_prefix}.*.timer.schedule",
                    f"{settings.subject_prefix}.*.timer.cancel",
                ],
                retention=api.RetentionPolicy.WORK_QUEUE,
            )
        )
    expected = f"stream {settings.command_stream}: max age unlimited must not exceed TIMER_RETENTION"
    with pytest.raises(ConfigError, match=expected):
        await asyncio.wait_for(Replica(settings).run(handle_signals=False), timeout=30)
