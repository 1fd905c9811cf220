"""The producer client's bulk sends and its DueTimeReached consumer (issue 21, items 5 and 6)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import nats
import pytest
from nats.js import api

from tests.helpers import row, running_replica, until
from worker.adapters.broker import Broker
from worker.client import TimerClient
from worker.config import Settings


@pytest.fixture
async def streams(settings: Settings) -> AsyncIterator[Broker]:
    b = Broker(settings)
    await b.connect()
    await b.ensure_streams()
    yield b
    await b.close()


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[TimerClient]:
    c = TimerClient(await nats.connect(settings.nats_url), settings.subject_prefix, owns_connection=True)
    async with c:
        yield c


def timers(n: int, tenant: str = "acme", start: int = 0) -> list[dict[str, object]]:
    due = datetime.now(UTC) + timedelta(hours=1)
    return [{"tenantId": tenant, "serviceCallId": f"sc-{i}", "dueAt": due} for i in range(start, start + n)]


async def command_headers(
    streams: Broker, settings: Settings
) -> tuple[int, dict[str, str], dict[str, object]]:
    info = await streams.js.stream_info(settings.command_stream)
    msg = await streams.js.get_msg(settings.command_stream, seq=int(info.state.last_seq))
    return int(info.state.messages), dict(msg.headers or {}), json.loads(msg.data or b"")


async def test_schedule_many_stores_each_command_once_with_its_own_id(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    n = 2500  # three atomic batches
    sent = await client.schedule_many(
        [*timers(n), {"tenantId": "no.dots", "serviceCallId": "x", "dueAt": "x"}]
    )
    assert [s.outcome for s in sent[:n]] == ["accepted"] * n
    assert sent[n].outcome == "error" and "tenantId" in (sent[n].error or "")
    assert len({s.id for s in sent[:n]}) == n
    stored, headers, body = await command_headers(streams, settings)
    assert stored == n
    assert headers["Nats-Msg-Id"] == body["id"] == sent[n - 1].id
    assert body["type"] == "ScheduleTimer" and body["payload"]["serviceCallId"] == f"sc-{n - 1}"  # type: ignore[index]


async def test_a_batch_with_a_command_already_stored_reports_it_as_a_duplicate(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    first = await client.schedule_many(timers(3))
    assert [s.outcome for s in first] == ["accepted"] * 3
    # A producer retrying a batch whose PubAck it lost sends the same ids again.
    from worker import client as client_module

    again = [
        client_module._Command(settings.subject_prefix + ".acme.timer.schedule", s.id, b"{}") for s in first
    ]
    fresh = client._commands("schedule", "ScheduleTimer", timers(1, start=9))
    results = await client._send_many([*again, *fresh], timeout=5)
    assert [s.outcome for s in results] == ["duplicate"] * 3 + ["accepted"]
    stored, _, _ = await command_headers(streams, settings)
    assert stored == 4


async def test_a_command_stream_without_atomic_batches_still_gets_every_command(
    settings: Settings, client: TimerClient
) -> None:
    b = Broker(settings)
    await b.connect()
    config = b.stream_configs()[0]
    config.allow_atomic = False  # as a command stream made before schedule_many
    await b.js.add_stream(config)
    await b.ensure_streams()
    try:
        sent = await client.cancel_many([{"tenantId": "acme", "serviceCallId": f"c-{i}"} for i in range(300)])
        assert [s.outcome for s in sent] == ["accepted"] * 300
        assert not client._atomic
        info = await b.js.stream_info(settings.command_stream)
        assert not info.config.allow_atomic, "an existing stream is never rewritten"
        assert info.state.messages == 300
    finally:
        await b.close()


async def test_scheduled_in_bulk_they_fire_and_due_events_acknowledges_in_batches(
    settings: Settings, db_url: str, client: TimerClient
) -> None:
    n = 600
    due = datetime.now(UTC) + timedelta(seconds=1)
    async with running_replica(settings):
        sent = await client.schedule_many(
            [{"tenantId": "acme", "serviceCallId": f"b-{i}", "dueAt": due} for i in range(n)]
        )
        assert all(s.outcome == "accepted" for s in sent)
        seen: list[str] = []
        events = client.due_events("acme", durable="billing", stream=settings.event_stream, ack_every=100)
        async with asyncio.timeout(60):
            async for event in events:
                assert event.event["type"] == "DueTimeReached"
                seen.append(event.payload["serviceCallId"])
                event.ack()
                if len(seen) == n:
                    break
        await events.aclose()
        assert sorted(seen) == sorted(f"b-{i}" for i in range(n))
        await until(lambda: row(db_url, "acme", "b-0") is not None)
        info = await client.js.consumer_info(settings.event_stream, "billing")
        assert info.config.ack_policy == api.AckPolicy.ALL

        async def all_acknowledged() -> bool:
            # Acks are published, not requested: the server takes them in its own time.
            return (await client.js.consumer_info(settings.event_stream, "billing")).num_ack_pending == 0

        await until(all_acknowledged, what="every handled event acknowledged")
        assert info.delivered.consumer_seq == n, "each delivered once"
