"""The producer client's bulk sends (worker/client/producer.py, batches.py) and its DueTimeReached
consumer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
from nats.js import api

from tests.helpers import row, running_replica, until
from worker.adapters.jetstream.broker import Broker
from worker.client import TimerClient, batches
from worker.client.envelopes import Envelope, Envelopes
from worker.config import Settings


@pytest.fixture
async def fast_client(settings: Settings) -> AsyncIterator[TimerClient]:
    # "on": fast batches on this single server too (auto keeps atomic ones there: TimerClient).
    nc = await nats.connect(settings.nats_url)
    async with TimerClient(nc, settings.subject_prefix, owns_connection=True, fast_ingest="on") as c:
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
    streams: Broker, fast_client: TimerClient, settings: Settings
) -> None:
    client = fast_client
    first = await client.schedule_many(timers(3))
    assert [s.outcome for s in first] == ["accepted"] * 3
    assert client._fast, "the command stream takes fast batches"
    # A producer retrying a batch whose PubAck it lost sends the same ids again. A fast batch
    # would skip them in silence, so ids sent before never go in one (fresh=False).
    again = [Envelope(settings.subject_prefix + ".acme.timer.schedule", s.id, b"{}") for s in first]
    fresh = client._commands("schedule", "ScheduleTimer", timers(1, start=9))
    results = await client._send_many([[*again, *fresh]], timeout=5, fresh=False)
    assert [s.outcome for s in results] == ["duplicate"] * 3 + ["accepted"]
    stored, _, _ = await command_headers(streams, settings)
    assert stored == 4


async def test_schedule_many_in_fast_batches_stores_each_once_and_reports_each_refusal(
    settings: Settings, fast_client: TimerClient
) -> None:
    b = Broker(settings)
    await b.connect()
    config = b.stream_configs()[0]
    assert config.allow_batched, "the service makes its command stream ready for fast batches"
    config.max_msg_size = 1000
    await b.js.add_stream(config)
    await b.ensure_streams()
    try:
        n = 2500  # three fast batches
        items = timers(n)
        items[1200] = {**items[1200], "data": "x" * 2000}  # over max_msg_size: refused, alone
        sent = await fast_client.schedule_many(items)
        assert fast_client._fast
        outcomes = [s.outcome for s in sent]
        assert outcomes == ["accepted"] * 1200 + ["error"] + ["accepted"] * (n - 1201)
        assert "maximum" in (sent[1200].error or "").lower()
        stored, _, _ = await command_headers(b, settings)
        assert stored == n - 1, "each accepted command stored once"
        # Fast batch information travels in the reply subject, not in the stored headers.
        first = await b.js.get_msg(settings.command_stream, seq=1)
        assert dict(first.headers or {}) == {"Nats-Msg-Id": sent[0].id}
    finally:
        await b.close()


async def test_commands_a_lost_fast_batch_ack_left_unknown_come_back_as_duplicates(
    streams: Broker, fast_client: TimerClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_reply = batches.FastBatch.on_reply

    def losing_the_pub_ack(batch: batches.FastBatch, reply: dict[str, object], seq: int) -> None:
        if reply.get("batch") != batch.id:  # flow acks and errors arrive; the final PubAck is lost
            on_reply(batch, reply, seq)

    monkeypatch.setattr(batches.FastBatch, "on_reply", losing_the_pub_ack)
    n = 900  # one batch: the server acks its flow every 500 stored, then sends its PubAck
    sent = await fast_client.schedule_many(timers(n), timeout=3)
    outcomes = [s.outcome for s in sent]
    # The server stored all; what the flow acks did not confirm went again one by one, same ids.
    flowed = outcomes.count("accepted")
    assert outcomes == ["accepted"] * flowed + ["duplicate"] * (n - flowed)
    assert flowed < n
    stored, _, _ = await command_headers(streams, settings)
    assert stored == n


async def test_a_command_stream_without_fast_batches_takes_atomic_ones(
    settings: Settings, fast_client: TimerClient
) -> None:
    b = Broker(settings)
    await b.connect()
    config = b.stream_configs()[0]
    config.allow_batched = False  # as a command stream made before fast batches
    await b.js.add_stream(config)
    await b.ensure_streams()
    try:
        sent = await fast_client.schedule_many(timers(1500))
        assert [s.outcome for s in sent] == ["accepted"] * 1500
        assert fast_client._fast is False and fast_client._atomic
        stored, headers, _ = await command_headers(b, settings)
        assert stored == 1500 and "Nats-Batch-Id" in headers, "sent in atomic batches"
        info = await b.js.stream_info(settings.command_stream)
        assert not info.config.allow_batched, "an existing stream is never rewritten"
    finally:
        await b.close()


async def test_auto_keeps_atomic_batches_on_a_stream_with_one_replica_the_service_did_not_measure(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    # One server under sync_interval: always: a fast batch fsyncs each command, an atomic batch once.
    # The service measures which (jetstream/test_probe.py); unmeasured, atomic batches.
    sent = await client.schedule_many(timers(200))
    assert [s.outcome for s in sent] == ["accepted"] * 200
    info = await streams.js.stream_info(settings.command_stream)
    assert info.config.allow_batched and info.config.num_replicas == 1
    assert client._fast is False
    _, headers, _ = await command_headers(streams, settings)
    assert "Nats-Batch-Id" in headers


async def test_a_command_stream_without_atomic_batches_still_gets_every_command(
    settings: Settings, client: TimerClient
) -> None:
    b = Broker(settings.model_copy(update={"events_fast_ingest": "off"}))  # as the `streams` fixture
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
        assert info.config.ack_policy == api.AckPolicy.EXPLICIT

        async def all_acknowledged() -> bool:
            # Acks are published, not requested: the server takes them in its own time.
            return (await client.js.consumer_info(settings.event_stream, "billing")).num_ack_pending == 0

        await until(all_acknowledged, what="every handled event acknowledged")
        assert info.delivered.consumer_seq == n, "each delivered once"


@pytest.mark.parametrize("fast", [False, True], ids=["atomic", "fast"])
async def test_each_batch_is_on_the_wire_before_the_next_is_built(
    streams: Broker,
    client: TimerClient,
    fast_client: TimerClient,
    settings: Settings,
    fast: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The server stores one batch while the client builds the next: nothing of the batches before
    # may still wait in nats-py's buffer for its flusher when the next part is built.
    sender = fast_client if fast else client
    waiting: list[int] = []
    part = Envelopes.part

    def building(self: Envelopes, payloads: Any) -> list[Any]:
        waiting.append(sender.nc._pending_data_size)
        return part(self, payloads)

    monkeypatch.setattr(Envelopes, "part", building)
    sent = await sender.schedule_many(timers(3500))  # four batches
    assert [s.outcome for s in sent] == ["accepted"] * 3500
    assert sender._fast is fast
    assert waiting == [0, 0, 0, 0]
    stored, _, _ = await command_headers(streams, settings)
    assert stored == 3500


async def test_a_payload_json_dumps_refuses_raises_and_nothing_is_sent(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    items = [*timers(2500), {"tenantId": "acme", "serviceCallId": "x", "dueAt": "x", "data": {1j}}]
    with pytest.raises(TypeError, match="not JSON serializable"):
        await client.schedule_many(items)
    info = await streams.js.stream_info(settings.command_stream)
    assert info.state.messages == 0
