"""TimerClient.due_events where events are not acknowledged: what a reader holds for them stays
bounded however often they come again, and both ways of reading (wire.take_raw and nats-py's
own queue) send acks made while waiting and hand back everything received at once when the loop
ends, never after the ack wait."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator

import pytest

from tests.helpers import until
from tests.integration.test_consumer import all_acknowledged, billing_config, publish_events
from worker.adapters.jetstream.broker import Broker
from worker.client import TimerClient, acks, consumer
from worker.config import Settings

HOOKED = pytest.mark.parametrize("hooked", [True, False], ids=["take_raw", "nats-py's queue"])


def read_through(monkeypatch: pytest.MonkeyPatch, hooked: bool) -> None:
    if not hooked:  # a nats-py whose parser take_raw does not know: its subscription's queue
        monkeypatch.setattr(consumer, "take_raw", lambda *_: None)


async def ack_pending(client: TimerClient, settings: Settings) -> int:
    return int((await client.js.consumer_info(settings.event_stream, "billing")).num_ack_pending)


async def all_delivered(client: TimerClient, settings: Settings) -> bool:
    return int((await client.js.consumer_info(settings.event_stream, "billing")).num_pending) == 0


def billing(client: TimerClient, settings: Settings) -> AsyncGenerator[consumer.DueEvent, None]:
    return client.due_events("acme", durable="billing", stream=settings.event_stream)


@HOOKED
async def test_a_reader_that_stops_hands_back_at_once_what_it_received_and_did_not_give_out(
    streams: Broker, client: TimerClient, settings: Settings, monkeypatch: pytest.MonkeyPatch, hooked: bool
) -> None:
    # An ack wait of 5 minutes: the next reader gets them within the minute only by the -NAK.
    read_through(monkeypatch, hooked)
    config = dataclasses.replace(billing_config(settings, idle_heartbeat=5.0), ack_wait=300)
    await streams.js.add_consumer(settings.event_stream, config)
    await publish_events(streams, settings, 300)
    got: list[str] = []
    async with asyncio.timeout(60):
        async for event in (events := billing(client, settings)):
            event.ack()
            got.append(event.id)
            if len(got) == 1:  # the other 299 pushed to this reader: received, not given out
                await until(lambda: all_delivered(client, settings), what="every event delivered")
            if len(got) == 120:
                break
    await events.aclose()
    async with asyncio.timeout(60):
        async for event in (again := billing(client, settings)):
            event.ack()
            got.append(event.id)
            if len(got) == 300:
                break
    await again.aclose()
    assert got == [f"e-{i}" for i in range(300)]
    await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")


@HOOKED
async def test_acks_made_while_the_reader_waits_go_out_without_another_event_either_way(
    streams: Broker, client: TimerClient, settings: Settings, monkeypatch: pytest.MonkeyPatch, hooked: bool
) -> None:
    # Handlers in tasks of their own ack after the loop went back to waiting for a next event
    # that a quiet tenant does not send: the acks must go out now, not after the ack wait.
    read_through(monkeypatch, hooked)
    await publish_events(streams, settings, 10)
    handled = asyncio.Event()
    given: list[consumer.DueEvent] = []

    async def handle(event: consumer.DueEvent) -> None:
        await handled.wait()
        event.ack()

    async def read() -> None:
        async with asyncio.TaskGroup() as handlers:
            async for event in client.due_events("acme", durable="billing", stream=settings.event_stream):
                given.append(event)
                handlers.create_task(handle(event))

    reader = asyncio.create_task(read())
    try:
        await until(lambda: len(given) == 10, what="the events given out")
        handled.set()
        await until(lambda: all(e.acked for e in given), what="the handlers' acks")
        await until(lambda: all_acknowledged(client, settings), timeout=10, what="their acks sent")
        assert not reader.done(), reader
    finally:
        reader.cancel()
        await asyncio.wait([reader])


@HOOKED
@pytest.mark.timeout(120)
async def test_events_that_come_again_unacknowledged_do_not_pile_up_in_the_reader(
    streams: Broker,
    client: TimerClient,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    hooked: bool,
) -> None:
    # A handler that keeps failing on the same events (caught, not acknowledged): each comes
    # again after the ack wait with a reply subject of its own. What the reader keeps for each
    # delivery must not grow with the deliveries, only with the events not acknowledged.
    read_through(monkeypatch, hooked)
    monkeypatch.setattr(acks, "_OPEN_FLOOR", 4)  # looked at after a few deliveries, not 1000s
    events_n, rounds = 5, 6
    config = dataclasses.replace(billing_config(settings, idle_heartbeat=5.0), ack_wait=0.5)
    await streams.js.add_consumer(settings.event_stream, config)
    await publish_events(streams, settings, events_n)
    first: dict[str, consumer.DueEvent] = {}
    latest: dict[str, consumer.DueEvent] = {}
    earlier: list[consumer.DueEvent] = []
    held: list[int] = []
    events = client.due_events("acme", durable="billing", stream=settings.event_stream)
    async with asyncio.timeout(60):
        async for event in events:
            if event.id in latest:
                earlier.append(latest[event.id])
            latest[event.id] = event
            first.setdefault(event.id, event)
            held.append(len(event._acks.open))
            if len(earlier) == events_n * (rounds - 1):
                break
    assert len(held) == events_n * rounds
    assert max(held) <= 2 * events_n, f"held for {len(held)} deliveries of {events_n} events: {held}"
    # The first delivery of each, long superseded and no longer held: its ack still goes out, and
    # the server takes it for the event.
    for event in first.values():
        assert event.reply not in event._acks.open
        event.ack()
        assert event.acked
    # Sent once the loop goes back for more; the loop is ended from here, which sends them first.
    await events.aclose()
    await until(
        lambda: _equals(ack_pending(client, settings), 0), timeout=10, what="the first deliveries acked"
    )
    info = await client.js.consumer_info(settings.event_stream, "billing")
    assert info.ack_floor.stream_seq == events_n and info.num_pending == 0


async def _equals(value: object, expected: object) -> bool:
    return bool(await value == expected)  # type: ignore[misc]
