"""TimerClient.due_events: DueTimeReached events, acknowledged in batches."""

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

from worker.client import pulls as pulls_module
from worker.client.acks import Acks
from worker.client.pulls import Pulls
from worker.client.wire import acknowledge, connection_of, queued, subscription_id, take_raw

_DECODER = json.JSONDecoder()
_SCAN = json.scanner.make_scanner(_DECODER)  # type: ignore[arg-type]  # typeshed: "a make_scanner"
_STATUS = b"NATS/1.0 "  # a status message's header line (a plain one ends `NATS/1.0\r\n`)
_STATUS_HEADER = "Status"
_DESCRIPTION = "Description"
_PENDING = "Nats-Pending-Messages"  # the events a request did not deliver


class DueEvent:
    """One DueTimeReached (docs/CONTRACT.md): its envelope, headers, and ack()."""

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
        self.reply = reply  # its ack subject
        self.data = data  # the envelope's JSON
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
        """`<prefix>.<tenantId>.timer.due`."""
        return self._subject.decode()

    @property
    def id(self) -> str:
        """One id per occurrence, however often delivered: drop one already handled."""
        return str(self.event["id"])

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.event["payload"]
        return payload

    @property
    def headers(self) -> dict[str, str]:
        """Its NATS headers: Nats-Msg-Id, and those carried from the ScheduleTimer."""
        if self._headers is None:
            self._headers = _parse_headers(self._raw_headers)
        return self._headers

    def ack(self) -> None:
        """Handled: acknowledged with the next batch of acks. Once the loop has ended it does
        nothing (`acked` stays False): the event was handed back."""
        acks = self._acks
        if self.acked or acks.closed:
            return
        self.acked = True
        acks.open.pop(self.reply, None)
        acks.done.append(self.reply)
        if acks.wake is not None:  # acked from another task while the reader waits
            acks.wake.set()


def _decode(data: bytes) -> dict[str, Any]:
    # The C scanner alone skips decode()'s whitespace passes; decode() says why for the rest.
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
    # As nats-py reads a header block.
    headers: dict[str, str] = {}
    for line in (raw or b"").split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip():
            headers[name.strip().decode("ascii", "replace")] = value.strip().decode("utf-8", "replace")
    return headers


# Unacknowledged events, at most, over all readers of a consumer: slow readers are not flooded.
MAX_ACK_PENDING = 4096


def pull_config(max_ack_pending: int = MAX_ACK_PENDING) -> api.ConsumerConfig:
    """The consumer due_events reads (and an operator provisions): pull, explicit acks."""
    return api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, max_ack_pending=max_ack_pending)


# subject, reply, data, raw headers, parsed headers
_Arrival = tuple[bytes, bytes, bytes, bytes | None, dict[str, str] | None]


async def due_events(
    js: JetStreamContext,
    subject: str,
    *,
    durable: str,
    stream: str,
    ack_every: int,
    max_ack_pending: int,
) -> AsyncGenerator[DueEvent, None]:
    """The DueTimeReached events on `subject`, oldest first, from pull consumer `durable` on
    `stream` (created when missing), which many readers may share. Call `event.ack()` once
    handled, else it comes again after the ack wait. Acks go out every `ack_every` events and
    when none are waiting; what the loop holds at its end is handed back (NAK)."""
    nc = connection_of(js)
    info = await _bound(js, stream, durable, subject, max_ack_pending)
    arrived: deque[_Arrival] = deque()
    waiting = asyncio.Event()
    acks = Acks()
    # Under the connection's inbox prefix (docs/SECURITY.md).
    inbox = nc.new_inbox()
    pulls = Pulls(stream, info.name, inbox)

    def on_raw(subject: bytes, reply: bytes, data: bytes, raw_headers: bytes | None) -> None:
        if raw_headers is None or not raw_headers.startswith(_STATUS):
            if reply:  # see _delivered
                arrived.append((subject, reply, data, raw_headers, None))
        else:
            pending = _parse_headers(raw_headers).get(_PENDING)
            line = raw_headers.split(b"\r\n", 1)[0]
            pulls.ended(line[9:12], _count(pending), line[13:].decode("utf-8", "replace"))
        waiting.set()

    sub = await nc.subscribe(inbox)
    release = take_raw(nc, subscription_id(sub), on_raw)
    # Where take_raw cannot hook in: one next_msg at a time, never cancelled while the reader
    # waits (it may have taken an event already); an ack() wakes the reader beside it.
    getter: asyncio.Future[Msg] | None = None

    def not_given() -> list[bytes]:
        """After the UNSUB and flush: the events received and not given out."""
        replies = [a[1] for a in arrived]
        if getter is not None:
            if getter.done() and not getter.cancelled() and getter.exception() is None:
                if _delivered(got := getter.result()):
                    replies.append(got.reply.encode())
            else:  # one it took comes again after the ack wait
                getter.cancel()
        while (held := queued(sub)) is not None:
            if _delivered(held):
                replies.append(held.reply.encode())
        return replies

    # A deleted consumer or a closed connection is only silence: two heartbeats missed.
    silence = 2 * pulls_module.HEARTBEAT_S

    async def after_silence() -> None:
        await _still_there(js, stream, durable)
        pulls.anew(len(arrived))

    async def next_queued() -> _Arrival:
        nonlocal getter
        while True:
            if acks.done:  # acked while it waited
                await acks.send(nc)
            await pulls.top_up(nc)
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
            except nats.errors.TimeoutError:
                await after_silence()
                continue
            headers = msg.headers or {}
            if (status := headers.get(_STATUS_HEADER)) is not None:
                pulls.ended(status.encode(), _count(headers.get(_PENDING)), headers.get(_DESCRIPTION, ""))
            elif _delivered(msg):
                return _arrival(msg)

    async def next_arrival() -> _Arrival:
        if release is None:  # take_raw cannot hook this nats-py
            return await next_queued()
        while not arrived:
            if acks.done:  # acked while it waited: sent now, a next event may not come
                await acks.send(nc)
                continue
            await pulls.top_up(nc)
            waiting.clear()
            acks.wake = waiting
            try:
                async with asyncio.timeout(silence):  # any arrival, heartbeats too, sets `waiting`
                    await waiting.wait()
            except TimeoutError:
                await after_silence()
            finally:
                acks.wake = None
        return arrived.popleft()

    try:
        while True:
            if not arrived or len(acks.done) >= ack_every:
                await acks.send(nc)
            await pulls.top_up(nc)
            arrival = await next_arrival()
            pulls.given()
            event = DueEvent(*arrival, acks)
            acks.open[event.reply] = None
            if len(acks.open) > acks.prune_at:
                acks.forget_superseded()
            yield event
    finally:
        await _close(nc, sub, release, acks, not_given)


async def _bound(
    js: JetStreamContext, stream: str, durable: str, subject: str, max_ack_pending: int
) -> api.ConsumerInfo:
    """The durable's info, made when missing; refused with why when due_events cannot share it.
    Only its info is asked when it exists: a tenant may not create consumers."""
    info: api.ConsumerInfo
    try:
        info = await js.consumer_info(stream, durable)
    except nats.js.errors.NotFoundError:
        config = pull_config(max_ack_pending)
        config.durable_name, config.filter_subject = durable, subject
        # two readers making it at once both succeed
        info = await js.add_consumer(stream, config)
    config = info.config
    if config.deliver_subject:
        raise ValueError(
            f"consumer {durable!r} on {stream} is a push consumer (due_events made those before "
            "it read pull consumers): delete it (`nats consumer rm`) once no reader is on it, or "
            "read from a new durable name"
        )
    if config.filter_subject not in (None, "", subject):
        raise ValueError(f"consumer {durable!r} on {stream} reads {config.filter_subject}, not {subject}")
    if config.ack_policy != api.AckPolicy.EXPLICIT:
        raise ValueError(
            f"consumer {durable!r} on {stream} acknowledges with ack_policy {config.ack_policy}, not "
            "explicit: one reader's ack would cover events another had in flight, unhandled. Delete "
            "it (`nats consumer rm`) once idle, or read from a new durable name"
        )
    return info


async def _still_there(js: JetStreamContext, stream: str, durable: str) -> None:
    """After a silence: raise what ended the reading, if something did."""
    nc = connection_of(js)
    if nc.is_closed:
        raise nats.errors.ConnectionClosedError
    if not nc.is_connected:  # reconnecting: looked at again after the next silence
        return
    try:
        info = await js.consumer_info(stream, durable)
    except (nats.js.errors.NotFoundError, nats.errors.ConnectionClosedError):
        raise
    except nats.errors.Error:  # slow or restarting: the same
        return
    if info.config.deliver_subject:
        raise nats.js.errors.Error(
            description=f"consumer {durable!r} on {stream} was deleted and made again as a push consumer"
        )


async def _close(
    nc: Any, sub: Any, release: Callable[[], None] | None, acks: Acks, not_given: Callable[[], list[bytes]]
) -> None:
    # Handed back now, not after the ack wait, but only once the server stopped sending here:
    # after the UNSUB and a flush's round trip.
    try:
        await acks.send(nc)
        await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await nc.flush(timeout=5)
        await acks.send(nc)  # those acknowledged meanwhile
        back = [*acks.open, *not_given()]
        acks.closed = True  # from here ack() does nothing
        acks.open.clear()
        await acknowledge(nc, back, b"-NAK")
    except (
        nats.errors.ConnectionClosedError,
        nats.errors.ConnectionDrainingError,
        nats.errors.BadSubscriptionError,
    ):
        # Closed under it: what it held comes again after the ack wait. Raised, it would hide
        # what ended the loop.
        pass
    finally:
        acks.closed = True
        acks.open.clear()
        if release is not None:
            release()


def _count(header: str | None) -> int | None:
    return int(header) if header and header.isdigit() else None


def _delivered(msg: Msg) -> bool:
    # One without an ack subject is not the consumer's; an ack to "" would cut the connection.
    return bool(msg.reply)


def _arrival(msg: Msg) -> _Arrival:
    return (msg.subject.encode(), msg.reply.encode(), msg.data, None, msg.headers or {})
