"""The client's consumer of DueTimeReached: TimerClient.due_events, acknowledged in batches."""

from __future__ import annotations

import asyncio
import contextlib
import json
import json.scanner
from collections import deque
from collections.abc import AsyncGenerator, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from worker.client.acks import Acks
from worker.client.wire import acknowledge, connection_of, queued, subscription_id, take_raw

_DECODER = json.JSONDecoder()
_SCAN = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]  # typeshed: "a make_scanner"
_STATUS = b"NATS/1.0 "  # a status message's header line; a message with headers starts `NATS/1.0\r\n`
_STALLED = b"Nats-Consumer-Stalled:"
# A consumer without idle heartbeats (made by hand): how long a reader waits in silence before
# it looks whether its connection and its consumer are still there.
_SILENCE_WITHOUT_HEARTBEATS = 30.0


class DueEvent:
    """One DueTimeReached (docs/CONTRACT.md) from due_events: its envelope, headers, and ack()."""

    __slots__ = ("_acks", "_event", "_headers", "_raw_headers", "_subject", "acked", "data", "reply")

    def __init__(
        self,
        subject: bytes,
        reply: bytes,
        data: bytes,
        raw_headers: bytes | None,
        headers: dict[str, str] | None,
        acks: Acks,
    ) -> None:
        self._subject, self._acks = subject, acks
        self.reply = reply  # where its acknowledgement goes
        self.data = data  # the envelope as published: JSON
        self._raw_headers, self._headers = raw_headers, headers
        self._event: dict[str, Any] | None = None
        self.acked = False

    @property
    def event(self) -> dict[str, Any]:
        """The envelope: id, type, tenantId, correlationId, timestampMs, payload."""
        if self._event is None:
            self._event = _decode(self.data)
        return self._event

    @property
    def subject(self) -> str:
        """Where it was published: `<prefix>.<tenantId>.timer.due`."""
        return self._subject.decode()

    @property
    def id(self) -> str:
        """One id per occurrence, however often it is delivered: drop one already handled."""
        return str(self.event["id"])

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.event["payload"]
        return payload

    @property
    def headers(self) -> dict[str, str]:
        """Its NATS headers: Nats-Msg-Id, and those carried from the ScheduleTimer (traceparent…)."""
        if self._headers is None:
            self._headers = _parse_headers(self._raw_headers)
        return self._headers

    def ack(self) -> None:
        """Handled: acknowledged with the next batch of acknowledgements (see due_events). Once
        the loop has ended it does nothing (`acked` stays False): the event was handed back.
        A delivery that a later one of the same event superseded is acknowledged too: the server
        takes an ack for the event, whichever of its deliveries it names."""
        acks = self._acks
        if self.acked or acks.closed:
            return
        self.acked = True
        acks.open.pop(self.reply, None)
        acks.done.append(self.reply)
        if acks.wake is not None:  # acked by a handler of its own while the reader waits
            acks.wake.set()


def _decode(data: bytes) -> dict[str, Any]:
    # The C scanner alone, without decode()'s whitespace passes: a third less per event. Anything
    # it does not take whole (whitespace around, not JSON) goes to decode(), which says why.
    text = data.decode()
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):
        value = _DECODER.decode(text)
    if not isinstance(value, dict):
        raise ValueError(f"a DueTimeReached is a JSON object, not {type(value).__name__}")
    return value


def _parse_headers(raw: bytes | None) -> dict[str, str]:
    # As nats-py reads a header block: `Name: value` lines after the `NATS/1.0` line.
    headers: dict[str, str] = {}
    for line in (raw or b"").split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip():
            headers[name.strip().decode("ascii", "replace")] = value.strip().decode("utf-8", "replace")
    return headers


# Events handed out and not yet acknowledged, at most, on a consumer due_events makes (and on a
# tenant's, `timer-service consumer add`): what keeps a slow reader from being flooded.
MAX_ACK_PENDING = 4096


def push_config(max_ack_pending: int = MAX_ACK_PENDING) -> api.ConsumerConfig:
    """The consumer due_events reads (and the one an operator provisions for a tenant, with a
    deliver subject and filter of its own, worker/ops/consumers.py): push, flow control, idle
    heartbeats, each event acknowledged on its own."""
    return api.ConsumerConfig(
        ack_policy=api.AckPolicy.EXPLICIT,
        max_ack_pending=max_ack_pending,
        flow_control=True,
        idle_heartbeat=5.0,
    )


# What arrives, in order: an event (subject, reply, data, raw headers, parsed headers), or a
# subject to answer with an empty message (flow control, a stalled consumer's heartbeat).
_Arrival = tuple[bytes, bytes, bytes, bytes | None, dict[str, str] | None] | str


async def due_events(
    js: JetStreamContext,
    subject: str,
    *,
    durable: str,
    stream: str,
    ack_every: int,
    max_ack_pending: int,
) -> AsyncGenerator[DueEvent, None]:
    """The DueTimeReached events on `subject`, oldest first, from the durable consumer `durable`
    on `stream` (created when missing). Call `event.ack()` once an event is handled: events
    not acknowledged come again after the consumer's ack wait (30 s), here or to the next
    consumer of that name, so an event is handled at least once. When the loop ends, the
    events it was given but not acknowledged, and those received but not yet given, are handed
    back at once (a NAK each), for the next reader.

    Cheaper per event than a pull subscription read with fetch(): the server pushes events
    as they are stored (with flow control), and each event's acknowledgement goes out with
    others in one write, every `ack_every` events and whenever no more events are waiting
    (acks made meanwhile, by handlers in tasks of their own, go at once).
    Each event is acknowledged on its own (AckPolicy EXPLICIT): with AckPolicy ALL, a reader
    that took over from one stopped with events in flight acknowledged those too with its first
    ack, unhandled (they come again only after the ack wait, behind newer ones).

    The events are read as the connection parses them (wire.take_raw), before nats-py makes
    a message of each, parses its headers and queues it for a task: that was half of a
    consumer's CPU per event (docs/BENCHMARKS.md). Flow control and heartbeats are answered
    here, in order with the events, as nats-py would.
    """
    config = push_config(max_ack_pending)
    nc = connection_of(js)
    arrived: deque[_Arrival] = deque()
    waiting = asyncio.Event()
    acks = Acks()

    def on_raw(subject: bytes, reply: bytes, data: bytes, raw_headers: bytes | None) -> None:
        if raw_headers is None or not raw_headers.startswith(_STATUS):
            if reply:  # else not the consumer's (_delivered)
                arrived.append((subject, reply, data, raw_headers, None))
        elif raw_headers[9:12] == b"100":  # flow control (it has a reply) or an idle heartbeat
            answer = reply.decode() if reply else _stalled(raw_headers)
            if answer:
                arrived.append(answer)
        waiting.set()

    # (flow_control given again: nats-py sets the config's from this argument, False by default)
    try:
        sub = await js.subscribe(
            subject, durable=durable, stream=stream, manual_ack=True, config=config, flow_control=True
        )
    except TypeError as exc:  # nats-py's word for a durable of that name that is a pull consumer
        if "deliver_subject" not in str(exc):
            raise
        raise ValueError(
            f"consumer {durable!r} on {stream} is a pull consumer: due_events reads a push consumer "
            "of its own; give it another durable name"
        ) from None
    # Without a callback nats-py keeps what arrives in the subscription's queue: what came
    # before take_raw, all older than what the handler gets, is taken from there first.
    release = take_raw(nc, subscription_id(sub), on_raw)
    if release is not None:  # (no await since take_raw: `arrived` is still empty)
        while (early := queued(sub)) is not None:
            if _delivered(early):
                arrived.append(_arrival(early))
    # Where take_raw cannot hook in: nats-py's own queue, read by one next_msg at a time. It is
    # never cancelled while the reader waits (a cancel can land after it took an event from the
    # queue, and the event would be lost to this reader): an ack() wakes the reader beside it.
    getter: asyncio.Future[Msg] | None = None

    def not_given() -> list[bytes]:
        """After the UNSUB and its flush: the events received and not given out."""
        replies = [a[1] for a in arrived if not isinstance(a, str)]
        if getter is not None:
            if getter.done() and not getter.cancelled() and getter.exception() is None:
                if _delivered(got := getter.result()):
                    replies.append(got.reply.encode())
            else:  # (one it took and had not handed over yet comes again after the ack wait)
                getter.cancel()
        while (held := queued(sub)) is not None:
            if _delivered(held):
                replies.append(held.reply.encode())
        return replies

    try:
        bound = (await js.consumer_info(stream, durable)).config
        policy = bound.ack_policy
        if policy != api.AckPolicy.EXPLICIT:
            raise ValueError(
                f"consumer {durable!r} on {stream} acknowledges with ack_policy {policy}, not explicit: "
                "one reader's ack would cover events another had in flight, unhandled. Delete it "
                "(`nats consumer rm`) once idle, or read from a new durable name"
            )
    except BaseException:
        await _close(nc, sub, release, acks, not_given)
        raise

    # The server tells a push consumer's reader neither that its consumer was deleted nor, here,
    # that the connection closed: it goes silent. Two heartbeats missed, as nats-py's own check.
    silence = 2 * (bound.idle_heartbeat or _SILENCE_WITHOUT_HEARTBEATS / 2)

    async def next_queued() -> _Arrival:
        nonlocal getter
        while True:
            if acks.done:  # acked while it waited: sent now, as below
                await acks.send(nc)
            if getter is None:
                getter = asyncio.ensure_future(sub.next_msg(timeout=silence))
            waiting.clear()
            acks.wake = waiting
            woken = asyncio.ensure_future(waiting.wait())
            try:
                await asyncio.wait((getter, woken), return_when=asyncio.FIRST_COMPLETED)
            finally:
                acks.wake = None
                woken.cancel()
            if not getter.done():
                continue
            done, getter = getter, None
            try:
                msg = done.result()
            except nats.errors.TimeoutError:  # (heartbeats are nats-py's: never here)
                await _still_there(js, stream, durable, bound.deliver_subject)
                continue
            if _delivered(msg):
                return _arrival(msg)

    async def next_arrival() -> _Arrival:
        if release is None:  # this nats-py's internals are not take_raw's: its own queue
            return await next_queued()
        while not arrived:
            if acks.done:  # acked while it waited: sent now, not with a next event that may not come
                await acks.send(nc)
                continue
            waiting.clear()
            acks.wake = waiting
            try:
                async with asyncio.timeout(silence):  # any arrival, a heartbeat too, sets `waiting`
                    await waiting.wait()
            except TimeoutError:
                await _still_there(js, stream, durable, bound.deliver_subject)
            finally:
                acks.wake = None
        return arrived.popleft()

    try:
        while True:
            if not arrived or len(acks.done) >= ack_every:
                await acks.send(nc)
            arrival = await next_arrival()
            if isinstance(arrival, str):  # answered once the events before it are out
                await nc.publish(arrival)
                continue
            event = DueEvent(*arrival, acks)
            acks.open[event.reply] = None
            if len(acks.open) > acks.prune_at:
                acks.forget_superseded()
            yield event
    finally:
        await _close(nc, sub, release, acks, not_given)


async def _still_there(js: JetStreamContext, stream: str, durable: str, deliver: str | None) -> None:
    """After a silence: raises what ended the reading, if something did (nats-py's next_msg
    raises ConnectionClosedError; consumer_info NotFoundError for a consumer deleted)."""
    nc = connection_of(js)
    if nc.is_closed:
        raise nats.errors.ConnectionClosedError
    if not nc.is_connected:  # reconnecting: heartbeats come again after, or it closes
        return
    try:
        info = await js.consumer_info(stream, durable)
    except (nats.js.errors.NotFoundError, nats.errors.ConnectionClosedError):
        raise
    except nats.errors.Error:  # slow, or restarting (503): looked at again after the next silence
        return
    if info.config.deliver_subject != deliver:  # deleted, and made again by another reader
        raise nats.js.errors.Error(
            description=f"consumer {durable!r} on {stream} was deleted and made again, for another reader"
        )


async def _close(
    nc: Any, sub: Any, release: Callable[[], None] | None, acks: Acks, not_given: Callable[[], list[bytes]]
) -> None:
    # Handed back for the next reader now, not after the ack wait; but only once the server
    # has stopped pushing here (it would push them straight back): after the UNSUB, and after
    # what it sent before it, which the round trip of a flush brings in.
    try:
        await acks.send(nc)
        await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await nc.flush(timeout=5)
        await acks.send(nc)  # those acknowledged meanwhile (by handlers in other tasks)
        back = [*acks.open, *not_given()]
        acks.closed = True  # from here ack() does nothing: the event comes again
        acks.open.clear()
        await acknowledge(nc, back, b"-NAK")
    except (
        nats.errors.ConnectionClosedError,
        nats.errors.ConnectionDrainingError,
        nats.errors.BadSubscriptionError,
    ):
        # Closed or drained under it (TimerClient.close): nothing goes out any more, and what it
        # held comes again after the ack wait. Raised here, it would take the place of what
        # ended the loop (a cancel, the user's own error).
        pass
    finally:
        acks.closed = True
        acks.open.clear()
        if release is not None:
            release()


def _delivered(msg: Msg) -> bool:
    # JetStream delivers each message with its ack subject as reply: one without is not the
    # consumer's (someone else's, on the deliver subject) and cannot be acknowledged (an ack to
    # "" is a protocol error: the server cuts the connection, and the acks written with it).
    return bool(msg.reply)


def _arrival(msg: Msg) -> _Arrival:
    return (msg.subject.encode(), msg.reply.encode(), msg.data, None, msg.headers or {})


def _stalled(raw_headers: bytes) -> str | None:
    # An idle heartbeat names, when the server thinks the consumer stalled, where to send the
    # flow control answer it missed.
    at = raw_headers.find(_STALLED)
    if at < 0:
        return None
    return raw_headers[at + len(_STALLED) :].split(b"\r\n", 1)[0].strip().decode() or None
