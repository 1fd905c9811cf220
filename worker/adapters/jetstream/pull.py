"""One JetStream pull consumer, read our own way: an inbox subscription whose callback fills a
buffer, and one `CONSUMER.MSG.NEXT` request per fetch (nats-py's fetch makes a task per message).

404, 408 and a 409 Leadership Change or Server Shutdown end a request; 409 Exceeded MaxRequestBatch
of N lowers the batch to N; any other status is PullFailed, naming it (ADR-13).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from collections import deque
from dataclasses import dataclass

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

# The request expires this much before the fetch gives up, so its 408 arrives while it waits.
EXPIRES_MARGIN_S = 0.01
# A request whose end never came (lost with a connection or a leader) is forgotten this long after
# it expired, and a fetch asks again; longer would stall intake after a leader's death.
FORGET_AFTER_S = 1.0
# 409s after which the consumer is still there: ask again.
_REQUEST_GONE = frozenset({"Leadership Change", "Server Shutdown"})
_MAX_BATCH = re.compile(r"Exceeded MaxRequestBatch of (\d+)")


class PullFailed(Exception):
    """The server refused a pull: its status and description ("503 No Responders")."""


@dataclass(slots=True)
class _Request:
    reply: str  # the status that ends it comes on this subject, a delivery on the message's own
    left: int  # deliveries still to come
    no_wait: bool
    expires_at: float  # monotonic, as the server counts it, about
    forget_at: float


class Pull:
    """The shared consumer `consumer` of `stream`: start(), then fetch() until unsubscribe()."""

    def __init__(self, nc: NATS, stream: str, consumer: str, api_prefix: str = "$JS.API") -> None:
        self._nc = nc
        self._next = f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self._inbox = nc.new_inbox()
        self._ids = itertools.count()
        self._sub: Subscription | None = None
        self._buffer: deque[Msg] = deque()
        self._request: _Request | None = None  # the one request this pull has out, if any
        self._failed: str | None = None
        self._max_batch: int | None = None  # the consumer's cap on a pull's batch, once it said so
        self._changed = asyncio.Event()

    async def start(self) -> None:
        # A subject per request under the inbox, so a status says which request it ends.
        self._sub = await self._nc.subscribe(f"{self._inbox}.*", cb=self.arrived)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    async def arrived(self, msg: Msg) -> None:
        """The subscription's callback: a delivery (it has an ack subject) or a status."""
        if msg.reply:
            self._buffer.append(msg)  # whichever request it answers: never dropped
            request = self._request
            if request is not None:
                request.left -= 1
                if request.left <= 0:
                    self._request = None
        else:
            self._status(msg)
        self._changed.set()

    def _status(self, msg: Msg) -> None:
        headers = msg.headers or {}
        code, description = headers.get("Status", ""), headers.get("Description", "")
        request = self._request
        if code == "100" or request is None or msg.subject != request.reply:
            return  # a heartbeat, or the end of a request already forgotten
        self._request = None
        if code in ("404", "408") or (code == "409" and description in _REQUEST_GONE):
            return
        if code == "409" and (cap := _MAX_BATCH.search(description)):
            self._max_batch = max(1, int(cap.group(1)))
        self._failed = f"{code or 'no status'} {description}".strip()

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        """Up to `batch` messages: what is buffered at once, else what one request brings within
        `timeout`. TimeoutError when nothing came, PullFailed when the server refused."""
        deadline = time.monotonic() + timeout
        batch = min(batch, self._max_batch or batch)
        no_wait = True
        while True:
            self._changed.clear()  # before looking: what arrives from here on wakes the wait
            if self._failed is not None:
                failed, self._failed = self._failed, None
                raise PullFailed(failed)
            now = time.monotonic()
            request = self._request
            if request is not None and now >= request.forget_at:
                self._request = request = None
            buffered = len(self._buffer)
            # A no_wait request ends as soon as it delivered what there was: wait for that end,
            # so a batch is whole; a lingering or expired one may trickle: take what came.
            if buffered >= batch or (
                buffered and (request is None or not request.no_wait or now >= request.expires_at)
            ):
                return self._take(batch)
            # Not while reconnecting: nats-py would hold the request and the server serve it late.
            if request is None and not self._nc.is_reconnecting:
                expires = deadline - now - EXPIRES_MARGIN_S
                if expires <= 0 and not no_wait:
                    raise TimeoutError
                # Shorter than the margin: ask once, no_wait with no expiry; later ones are buffered.
                await self._ask(batch, max(expires, 0.0), no_wait)
                no_wait = False  # a request that ends empty-handed, then waits its turn
                request = self._request
            wake = deadline
            if request is not None:
                wake = min(wake, request.expires_at if self._buffer else request.forget_at)
            try:
                await asyncio.wait_for(self._changed.wait(), max(0.0, wake - time.monotonic()))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    if self._buffer:
                        return self._take(batch)
                    raise TimeoutError from None

    async def _ask(self, batch: int, expires: float, no_wait: bool) -> None:
        reply = f"{self._inbox}.{next(self._ids)}"
        body: dict[str, object] = {"batch": batch}
        if expires > 0:
            body["expires"] = int(expires * 1e9)
        if no_wait:
            body["no_wait"] = True
        expires_at = time.monotonic() + expires
        self._request = _Request(reply, batch, no_wait, expires_at, expires_at + FORGET_AFTER_S)
        try:
            await self._nc.publish(self._next, json.dumps(body).encode(), reply=reply)
        except BaseException:
            self._request = None
            raise

    def _take(self, batch: int) -> list[Msg]:
        buffer = self._buffer
        if len(buffer) <= batch:
            taken = list(buffer)
            buffer.clear()
            return taken
        return [buffer.popleft() for _ in range(batch)]

    async def unsubscribe(self) -> None:
        """Stop, and NAK what was never handed out, for other replicas now; never raises if disconnected."""
        sub, self._sub = self._sub, None
        if sub is not None:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        while self._buffer:
            with contextlib.suppress(nats.errors.Error):
                await self._buffer.popleft().nak()
