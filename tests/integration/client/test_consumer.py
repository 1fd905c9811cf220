"""TimerClient.due_events reads its events as the connection parses them (wire.take_raw): every
event once and in stream order, headers intact, acknowledgements batched; and the same through
nats-py's own queue where take_raw cannot hook in. Several readers of one durable share it."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncGenerator, Iterable

import nats
import pytest
from nats.js import api

from tests.helpers import until
from worker.adapters.jetstream.broker import Broker
from worker.client import TimerClient, acks, consumer, pulls
from worker.config import Settings
from worker.devkit.embedded import EmbeddedNats

HOOKED = pytest.mark.parametrize("hooked", [True, False], ids=["take_raw", "nats-py's queue"])


def read_through(monkeypatch: pytest.MonkeyPatch, hooked: bool) -> None:
    if not hooked:  # a nats-py whose parser take_raw does not know: its subscription's queue
        monkeypatch.setattr(consumer, "take_raw", lambda *_: None)


PAD = "x" * 400  # events of ~600 bytes


async def publish_events(streams: Broker, settings: Settings, n: int, start: int = 0) -> None:
    subject = f"{settings.subject_prefix}.acme.timer.due"
    for i in range(start, start + n):
        body = {"id": f"e-{i}", "type": "DueTimeReached", "tenantId": "acme", "payload": {"i": i, "pad": PAD}}
        headers = {"Nats-Msg-Id": f"e-{i}", "traceparent": f"00-{i:032x}-{i:016x}-01"}
        await streams.nc.publish(subject, json.dumps(body).encode(), headers=headers)
    await streams.nc.flush()
    await until(lambda: stored(streams, settings, start + n), what=f"{start + n} events stored")


async def stored(streams: Broker, settings: Settings, n: int) -> bool:
    return (await streams.js.stream_info(settings.event_stream)).state.messages >= n


async def receive(
    client: TimerClient, settings: Settings, n: int, ack: bool = True
) -> list[consumer.DueEvent]:
    got: list[consumer.DueEvent] = []
    events = client.due_events("acme", durable="billing", stream=settings.event_stream, ack_every=100)
    async with asyncio.timeout(60):
        async for event in events:
            got.append(event)
            if ack:
                event.ack()
            if len(got) == n:
                break
    await events.aclose()
    return got


def in_order(ids: Iterable[str]) -> list[str]:
    """Event ids by stream order: handed-back events come again, but not always in their order."""
    return sorted(ids, key=lambda e: int(e[2:]))


async def all_acknowledged(client: TimerClient, settings: Settings) -> bool:
    info = await client.js.consumer_info(settings.event_stream, "billing")
    return info.num_ack_pending == 0 and info.num_pending == 0


async def test_every_event_once_in_order_with_its_headers(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    n = 4000  # many times what one request asks for: asked again and again as they are given out
    await publish_events(streams, settings, n)
    got = await receive(client, settings, n)
    assert [e.id for e in got] == [f"e-{i}" for i in range(n)]
    assert got[7].payload["i"] == 7 and got[7].subject == f"{settings.subject_prefix}.acme.timer.due"
    assert got[7].headers == {"Nats-Msg-Id": "e-7", "traceparent": f"00-{7:032x}-{7:016x}-01"}
    await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")


async def test_a_reader_that_stops_hands_back_what_it_did_not_acknowledge_at_once(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    # The next reader gets the handed-back events at once, though not always in their order: the
    # server may put one it could not give at once behind the others, or behind newer events.
    await publish_events(streams, settings, 300)
    first = await receive(client, settings, 120)
    assert [e.id for e in first] == [f"e-{i}" for i in range(120)]
    await publish_events(streams, settings, 300, start=300)
    rest = await receive(client, settings, 480)  # within 60 s: the ack wait (30 s) is not waited for
    assert in_order(e.id for e in rest) == [f"e-{i}" for i in range(120, 600)]
    await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")


async def test_events_in_flight_at_a_readers_crash_are_not_acknowledged_by_the_next_reader(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    # The consumer as due_events makes it, with a short ack wait so that redelivery is quick.
    config = dataclasses.replace(billing_config(settings), ack_wait=2)
    await streams.js.add_consumer(settings.event_stream, config)
    await publish_events(streams, settings, 300)
    crashing = TimerClient(await nats.connect(settings.nats_url), settings.subject_prefix)
    events = crashing.due_events("acme", durable="billing", stream=settings.event_stream, ack_every=100)
    async for event in events:  # all 300 delivered; 120 handled, their acks sent when idle
        if int(event.id[2:]) < 120:
            event.ack()
        if event.id == "e-299":
            break
    await crashing.nc.close()  # gone without a word: the other 180 are in flight
    with contextlib.suppress(Exception):
        await events.aclose()
    await publish_events(streams, settings, 300, start=300)
    seen: set[str] = set()
    after = client.due_events("acme", durable="billing", stream=settings.event_stream, ack_every=100)
    async with asyncio.timeout(60):
        async for event in after:  # new events first; the 180 after their ack wait
            seen.add(event.id)
            event.ack()
            if len(seen & {f"e-{i}" for i in range(120, 600)}) == 480:
                break
    await after.aclose()
    await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")


async def test_a_consumer_that_acknowledges_all_up_to_one_is_refused_with_why(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    config = dataclasses.replace(billing_config(settings), ack_policy=api.AckPolicy.ALL)
    await streams.js.add_consumer(settings.event_stream, config)
    events = client.due_events("acme", durable="billing", stream=settings.event_stream)
    with pytest.raises(ValueError, match=r"ack_policy .*all.*not explicit"):
        await events.__anext__()


async def test_events_come_through_nats_py_where_take_raw_cannot_hook_in(
    streams: Broker, client: TimerClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer, "take_raw", lambda *_: None)  # a nats-py whose parser it does not know
    await publish_events(streams, settings, 300)
    got = await receive(client, settings, 300)
    assert [e.id for e in got] == [f"e-{i}" for i in range(300)]
    assert got[3].headers["traceparent"] == f"00-{3:032x}-{3:016x}-01"
    await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")


async def billing_consumer(
    streams: Broker, settings: Settings, monkeypatch: pytest.MonkeyPatch, heartbeat: float
) -> None:
    """The consumer as due_events makes it; its readers' requests with a short heartbeat."""
    monkeypatch.setattr(pulls, "HEARTBEAT_S", heartbeat)
    await streams.js.add_consumer(settings.event_stream, billing_config(settings))


def billing_config(settings: Settings) -> api.ConsumerConfig:
    return api.ConsumerConfig(
        durable_name="billing",
        filter_subject=f"{settings.subject_prefix}.acme.timer.due",
        ack_policy=api.AckPolicy.EXPLICIT,
        max_ack_pending=4096,
    )


async def reading(client: TimerClient, settings: Settings, got: list[str]) -> None:
    async for event in client.due_events("acme", durable="billing", stream=settings.event_stream):
        got.append(event.id)
        event.ack()


async def ended(reader: asyncio.Task[None]) -> None:
    # Waited for, not awaited: a timeout would cancel it, and what the cancel makes of it is
    # another test's matter.
    await asyncio.wait([reader], timeout=30)
    if not reader.done():
        reader.cancel()
        await asyncio.wait([reader])
        pytest.fail("the reader is still waiting")


@pytest.mark.parametrize("end", ["close", "drain"])
async def test_a_reader_whose_connection_ends_is_told_not_left_waiting(
    streams: Broker, settings: Settings, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    await billing_consumer(streams, settings, monkeypatch, heartbeat=0.5)
    await publish_events(streams, settings, 10)
    nc = await nats.connect(settings.nats_url)
    got: list[str] = []
    reader = asyncio.create_task(reading(TimerClient(nc, settings.subject_prefix), settings, got))
    await until(lambda: len(got) == 10, what="the events read")
    await (nc.close() if end == "close" else nc.drain())
    await ended(reader)
    with pytest.raises(nats.errors.ConnectionClosedError):  # as nats-py's own next_msg does
        reader.result()


@HOOKED
async def test_a_reader_whose_consumer_is_deleted_is_told_not_left_waiting(
    streams: Broker, client: TimerClient, settings: Settings, monkeypatch: pytest.MonkeyPatch, hooked: bool
) -> None:
    read_through(monkeypatch, hooked)
    await billing_consumer(streams, settings, monkeypatch, heartbeat=0.5)
    await publish_events(streams, settings, 10)
    got: list[str] = []
    reader = asyncio.create_task(reading(client, settings, got))
    await until(lambda: len(got) == 10, what="the events read")
    await streams.js.delete_consumer(settings.event_stream, "billing")  # the server sends nothing
    await ended(reader)
    with pytest.raises(nats.js.errors.NotFoundError):
        reader.result()


async def test_a_reader_whose_consumer_is_made_again_as_a_push_consumer_is_told_not_left_waiting(
    streams: Broker, client: TimerClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Deleted (`nats consumer rm`) and made again, by hand, as a push consumer: its requests are
    # refused, and this reader would never get an event.
    await billing_consumer(streams, settings, monkeypatch, heartbeat=0.5)
    await publish_events(streams, settings, 10)
    got: list[str] = []
    reader = asyncio.create_task(reading(client, settings, got))
    await until(lambda: len(got) == 10, what="the events read")
    # The reader looks for its consumer only once it is made again: between the delete and the
    # add it would find none, and end with NotFoundError (another test's matter).
    made_again = asyncio.Event()
    still_there = consumer._still_there

    async def once_made_again(*args: str) -> None:
        await made_again.wait()
        await still_there(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(consumer, "_still_there", once_made_again)
    await streams.js.delete_consumer(settings.event_stream, "billing")
    config = billing_config(settings)
    config.deliver_subject = "deliver.another"
    await streams.js.add_consumer(settings.event_stream, config)
    made_again.set()
    await ended(reader)
    with pytest.raises(nats.js.errors.Error, match="made again as a push consumer"):
        reader.result()


async def test_a_reader_cancelled_after_its_connection_closed_ends_cancelled(
    streams: Broker, settings: Settings
) -> None:
    await publish_events(streams, settings, 10)
    nc = await nats.connect(settings.nats_url)
    got: list[str] = []
    reader = asyncio.create_task(reading(TimerClient(nc, settings.subject_prefix), settings, got))
    await until(lambda: len(got) == 10, what="the events read")
    await nc.close()
    reader.cancel()  # at once: well within the 10 s of silence after which it looks for itself
    with contextlib.suppress(asyncio.CancelledError):
        await reader
    assert reader.cancelled(), "closing on a closed connection must not turn a cancel into its error"


async def test_a_message_on_the_inbox_that_is_no_delivery_is_passed_over(
    streams: Broker, client: TimerClient, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without a reply it cannot be acknowledged: an ack to "" is a protocol error that cuts the
    # connection, and the acks written with it are lost (their events come again).
    monkeypatch.setattr(client.nc, "new_inbox", lambda: "inbox.billing")  # the reader's, known here
    await publish_events(streams, settings, 10)
    got: list[str] = []
    events = client.due_events("acme", durable="billing", stream=settings.event_stream, ack_every=100)
    async with asyncio.timeout(60):
        async for event in events:
            event.ack()
            got.append(event.id)
            if len(got) == 10:
                await streams.nc.publish("inbox.billing", b"not an event")
                await streams.nc.publish("inbox.billing", b"", headers={"k": "v"})
                await streams.nc.flush()
                await publish_events(streams, settings, 10, start=10)
            if len(got) == 20:
                break
    await events.aclose()
    assert got == [f"e-{i}" for i in range(20)]
    await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")
    assert client.nc.stats["reconnects"] == 0


@pytest.mark.timeout(120)
async def test_a_reader_reads_on_across_a_server_restart(
    streams: Broker, settings: Settings, embedded_nats: EmbeddedNats | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection re-subscribes with the same sid: the events after the restart come to the
    # same hook, in order, and a reader looking for its consumer while the server is away or
    # starting (no responders, 503) does not take that for its consumer gone. The restarted
    # server knows none of its requests: it asks again after a silence.
    assert embedded_nats is not None, "stops and restarts NATS: needs the embedded server"
    await billing_consumer(streams, settings, monkeypatch, heartbeat=0.5)
    await publish_events(streams, settings, 100)
    nc = await nats.connect(settings.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    client = TimerClient(nc, settings.subject_prefix, owns_connection=True)
    got: list[str] = []
    reader = asyncio.create_task(reading(client, settings, got))
    try:
        await until(lambda: len(got) == 100, what="the events before the restart read")
        await until(lambda: all_acknowledged(client, settings), what="those acknowledged")
        embedded_nats.stop()
        await until(lambda: not nc.is_connected, what="the reader sees NATS gone")
        await asyncio.sleep(2)  # not a wait for anything: an outage of two silences (1 s each)
        embedded_nats.start()
        await until(lambda: nc.is_connected, what="the reader reconnected")
        await until(lambda: streams.nc.is_connected, what="the publisher reconnected")
        await publish_events(streams, settings, 100, start=100)
        await until(lambda: len(got) == 200 or reader.done(), what="the events after the restart read")
        assert not reader.done(), reader
        assert got == [f"e-{i}" for i in range(200)]
        await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")
    finally:
        embedded_nats.start()
        reader.cancel()
        await asyncio.wait([reader])
        await client.close()


async def test_an_event_acknowledged_after_its_loop_ended_is_not_said_to_be_and_comes_again(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    await publish_events(streams, settings, 20)
    late = await receive(client, settings, 20, ack=False)
    for event in late[:10]:
        event.ack()
        assert not event.acked, "handed back when the loop ended: nothing acknowledges it now"
    again = await receive(client, settings, 20)
    assert in_order(e.id for e in again) == [f"e-{i}" for i in range(20)]
    await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")


@pytest.mark.parametrize(
    ("shape", "refusal"),
    [
        ({"deliver_subject": "deliver.billing"}, r"'billing' on .* is a push consumer"),
        ({"filter_subject": "svc.zeta.timer.due"}, r"'billing' on .* reads svc\.zeta\.timer\.due, not "),
    ],
    ids=["push", "another filter"],
)
async def test_a_consumer_of_that_name_it_cannot_share_is_refused_with_why(
    streams: Broker, client: TimerClient, settings: Settings, shape: dict[str, str], refusal: str
) -> None:
    # A push consumer: what due_events made before it read pull consumers.
    config = dataclasses.replace(billing_config(settings), **shape)
    await streams.js.add_consumer(settings.event_stream, config)
    events = client.due_events("acme", durable="billing", stream=settings.event_stream)
    with pytest.raises(ValueError, match=refusal):
        await events.__anext__()


# Several readers of one durable
#
# A consumer service of several pods reads one durable from each: each event is given to one
# reader, and what a reader held when it stopped or crashed goes to the others.


async def test_readers_of_one_durable_share_its_events_each_given_once(
    streams: Broker, client: TimerClient, settings: Settings
) -> None:
    await streams.js.add_consumer(settings.event_stream, billing_config(settings))
    readers = [client] + [
        TimerClient(await nats.connect(settings.nats_url), settings.subject_prefix) for _ in range(2)
    ]
    got: list[list[str]] = [[] for _ in readers]

    async def read(reader: TimerClient, into: list[str]) -> None:
        async for event in reader.due_events("acme", durable="billing", stream=settings.event_stream):
            into.append(event.id)
            event.ack()

    tasks = [asyncio.create_task(read(r, into)) for r, into in zip(readers, got, strict=True)]
    try:
        # Every reader's request waits on the server before the first event is stored: each
        # is given some, whoever the server serves first.
        await until(lambda: _equals(waiting_requests(client, settings), 3), what="three readers waiting")
        n = 3 * pulls.PULL_BATCH
        await publish_events(streams, settings, n)
        await until(lambda: sum(map(len, got)) >= n, what="every event given out")
        await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        for reader in readers[1:]:
            await reader.nc.close()
    given = [e for into in got for e in into]
    assert sorted(given) == sorted(f"e-{i}" for i in range(n)), "each event given once, none lost"
    assert all(got), [len(into) for into in got]
    for into in got:  # each reader's share in stream order
        assert into == sorted(into, key=lambda e: int(e[2:]))


async def waiting_requests(client: TimerClient, settings: Settings) -> int:
    return int((await client.js.consumer_info(settings.event_stream, "billing")).num_waiting)


@pytest.mark.parametrize("leaves", ["stops", "crashes"])
async def test_what_a_reader_held_when_it_left_goes_to_the_others(
    streams: Broker, client: TimerClient, settings: Settings, leaves: str
) -> None:
    # A reader that stops hands back what it held (a NAK each), to the others at once: an ack
    # wait of five minutes proves it. One that crashes hands back nothing: what it held comes
    # to the others after the ack wait (2 s here).
    ack_wait = 300 if leaves == "stops" else 2
    await streams.js.add_consumer(
        settings.event_stream, dataclasses.replace(billing_config(settings), ack_wait=ack_wait)
    )
    n = 600
    await publish_events(streams, settings, n)
    handled: list[str] = []
    leaving = TimerClient(await nats.connect(settings.nats_url), settings.subject_prefix)
    events = leaving.due_events("acme", durable="billing", stream=settings.event_stream)
    held: list[str] = []
    async with asyncio.timeout(60):
        async for event in events:  # 100 handled, 100 given out and not; more received, not given
            if len(handled) < 100:
                handled.append(event.id)
                event.ack()
            else:
                held.append(event.id)
            if len(held) == 100:
                break
    if leaves == "crashes":
        await leaving.nc.close()  # gone without a word
        with contextlib.suppress(Exception):
            await events.aclose()
    else:
        await events.aclose()
        await leaving.nc.close()
    others: list[list[str]] = [[], []]
    second = TimerClient(await nats.connect(settings.nats_url), settings.subject_prefix)

    async def read(reader: TimerClient, into: list[str]) -> None:
        async for event in reader.due_events("acme", durable="billing", stream=settings.event_stream):
            into.append(event.id)
            event.ack()

    tasks = [asyncio.create_task(read(r, into)) for r, into in zip((client, second), others, strict=True)]
    try:
        await until(lambda: set(held) <= {e for into in others for e in into}, what="the held events handled")
        await until(lambda: len(set(handled).union(*others)) == n, what="every event handled")
        await until(lambda: all_acknowledged(client, settings), what="every event acknowledged")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.wait(tasks)
        await second.nc.close()
    assert set(handled).union(*others) == {f"e-{i}" for i in range(n)}


# Redelivery
#
# TimerClient.due_events where events are not acknowledged: what a reader holds for them stays
# bounded however often they come again, and both ways of reading (wire.take_raw and nats-py's
# own queue) send acks made while waiting and hand back everything received at once when the loop
# ends, never after the ack wait.


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
    config = dataclasses.replace(billing_config(settings), ack_wait=300)
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
    assert got[:120] == [f"e-{i}" for i in range(120)] and in_order(got) == [f"e-{i}" for i in range(300)]
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
    config = dataclasses.replace(billing_config(settings), ack_wait=0.5)
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
