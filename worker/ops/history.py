"""A timer's firings, from the events stream: the DueTimeReached events published for it.

The stream is read as the DLQ listing reads its own (worker/ops/dlq.py): an ephemeral consumer
of this process, filtered to the tenant's due subject, starting at the timer's registration,
acknowledging nothing, deleted when done. Events are kept for TIMER_RETENTION, so older firings
are gone from here too. The tenant's other timers' events are read and skipped: at most
`max_scan` of them, and the answer says when the scan was cut there.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime

import nats.errors
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from worker.contract import Subjects

MAX_SCAN = 5000
BATCH = 256
KEEP = 50  # the newest firings shown


@dataclass(frozen=True, slots=True)
class Firing:
    seq: int
    due_at: str
    reached_at: str
    published: datetime | None


@dataclass(frozen=True, slots=True)
class History:
    firings: list[Firing]  # the newest KEEP, oldest first
    scanned: int
    cut: bool  # the scan stopped at max_scan with events left


async def firings(
    js: JetStreamContext,
    stream: str,
    prefix: str,
    tenant: str,
    service_call_id: str,
    since: datetime | None,
    max_scan: int = MAX_SCAN,
) -> History:
    """This timer's DueTimeReached events published since `since` (its registration)."""
    name = f"history-{uuid.uuid4().hex}"
    start = since.astimezone(UTC) if since else None
    config = api.ConsumerConfig(
        name=name,
        filter_subject=Subjects(prefix).due(tenant),
        deliver_policy=api.DeliverPolicy.BY_START_TIME if start else api.DeliverPolicy.ALL,
        opt_start_time=start,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=60.0,  # seconds: the server's clean-up if we die before deleting it
        mem_storage=True,
        num_replicas=1,
    )
    # The envelope id of an occurrence is "<tenant>:<serviceCallId>:<dueAt>" (contract.firing_id):
    # a cheap first test on the raw bytes; the parsed payload decides.
    needle = json.dumps(f"{tenant}:{service_call_id}:")[:-1].encode()
    found: deque[Firing] = deque(maxlen=KEEP)
    scanned, left = 0, 0
    try:
        info = await js.add_consumer(stream, config=config)
    except NotFoundError:
        return History([], 0, False)  # no events stream yet
    try:
        sub = await js.pull_subscribe_bind(consumer=name, stream=stream)
        left = int(info.num_pending or 0)
        while left > 0 and scanned < max_scan:
            try:
                batch = await sub.fetch(min(BATCH, left, max_scan - scanned), timeout=5)
            except nats.errors.TimeoutError:
                break  # aged out meanwhile
            for msg in batch:
                scanned += 1
                left = int(msg.metadata.num_pending)
                if needle not in msg.data:
                    continue
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    payload = json.loads(msg.data)["payload"]
                    if payload.get("serviceCallId") == service_call_id:
                        found.append(
                            Firing(
                                msg.metadata.sequence.stream,
                                str(payload.get("dueAt")),
                                str(payload.get("reachedAt")),
                                msg.metadata.timestamp,
                            )
                        )
        await sub.unsubscribe()
    finally:
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(stream, name)
    return History(list(found), scanned, left > 0)
