"""The client's consumer of DueTimeReached: TimerClient.due_events, acknowledged in batches."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncGenerator
from typing import Any

from nats.aio.msg import Msg
from nats.js import JetStreamContext, api


class DueEvent:
    """One DueTimeReached (docs/CONTRACT.md) from due_events: its envelope, and ack()."""

    __slots__ = ("acked", "event", "msg")

    def __init__(self, msg: Msg, event: dict[str, Any]) -> None:
        self.msg = msg
        self.event = event  # the envelope: id, type, tenantId, correlationId, timestampMs, payload
        self.acked = False

    @property
    def id(self) -> str:
        """One id per occurrence, however often it is delivered: drop one already handled."""
        return str(self.event["id"])

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = self.event["payload"]
        return payload

    def ack(self) -> None:
        """Handled: acknowledged with the next batch of acknowledgements (see due_events)."""
        self.acked = True


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
    consumer of that name, so an event is handled at least once.

    Cheaper per event than a pull subscription read with fetch(): the server pushes events
    as they are stored (with flow control), and acknowledgements go in batches: the consumer
    acknowledges "all up to here" (AckPolicy ALL) for the longest run of acknowledged events,
    every `ack_every` events and whenever no more events are waiting. An event acknowledged
    out of order is held back until those before it are acknowledged too.
    """
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.ALL,
        max_ack_pending=max_ack_pending,
        flow_control=True,
        idle_heartbeat=5.0,
    )
    # Our own queue, fed by nats-py's callback (which answers flow control and heartbeats):
    # reading the subscription with next_msg() or `messages` costs a task per event.
    arrived: asyncio.Queue[Msg] = asyncio.Queue()

    async def put(msg: Msg) -> None:
        arrived.put_nowait(msg)

    sub = await js.subscribe(
        subject,
        durable=durable,
        stream=stream,
        cb=put,
        manual_ack=True,
        config=config,
        pending_msgs_limit=max_ack_pending * 2,
    )
    unacked: deque[DueEvent] = deque()
    last_done: Msg | None = None
    since_ack = 0

    async def flush() -> None:
        nonlocal last_done, since_ack
        while unacked and unacked[0].acked:
            last_done = unacked.popleft().msg
        if last_done is not None:
            await last_done.ack()  # AckPolicy ALL: this one and every event before it
            last_done, since_ack = None, 0

    try:
        while True:
            if arrived.empty() or since_ack >= ack_every:
                await flush()
            msg = arrived.get_nowait() if not arrived.empty() else await arrived.get()
            while unacked and unacked[0].acked:
                last_done = unacked.popleft().msg
                since_ack += 1
            event = DueEvent(msg, json.loads(msg.data))
            unacked.append(event)
            yield event
    finally:
        try:
            await flush()
        finally:
            await sub.unsubscribe()
