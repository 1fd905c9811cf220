"""Publishing to JetStream: one by one with bounded pipelining, atomic batches, fast-ingest batches."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError

from worker.client.batches import (
    AGAIN,
    ATOMIC_BATCH_MAX,
    ERR_ATOMIC_DISABLED,
    FastBatch,
    FastBatches,
    api_error,
    atomic_batch_head,
    atomic_batch_headers,
    batch_ack_error,
)
from worker.client.wire import publish_all
from worker.contract import Outgoing

if TYPE_CHECKING:
    from worker.config import Settings

log = logging.getLogger(__name__)

# Fewer messages than this go one by one (see publish_atomic).
ATOMIC_BATCH_MIN = 100


class Publisher:
    """A connection's publishing to JetStream, and the replies it awaits."""

    def __init__(self, settings: Settings, on_failure: Callable[[], None]) -> None:
        self.settings = settings
        # After a publish failed: a missing stream would explain it (Broker.check_streams_soon).
        self._on_failure = on_failure
        self.nc: NATS | None = None
        self.atomic = True  # until the event stream says it does not allow atomic batches
        self.fast = False  # events in fast-ingest batches: decided by Broker.ensure_streams
        self._fast = FastBatches()
        # Publishes awaiting their PubAck: ours, as nats-py's publish_async keeps a permit for good
        # when the publish raises.
        self.permits = asyncio.Semaphore(settings.max_in_flight)
        self._replies: dict[str, asyncio.Future[Msg]] = {}
        self._reply_prefix = ""
        self._tokens = itertools.count()

    async def start(self, nc: NATS) -> None:
        """Subscribe to the replies on `nc`, a new connection."""
        self.nc = nc
        self._reply_prefix = f"{nc.new_inbox()}."
        await nc.subscribe(f"{self._reply_prefix}*", cb=self._on_reply)
        await self._fast.start(nc)

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        """Publish with bounded pipelining; for each message, None once JetStream acknowledged it.
        All ends by the deadline: what is unacknowledged then fails, and every permit comes back."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        replies: list[asyncio.Future[Msg]] = []
        try:
            for m in messages:
                replies.append(await self._send(m.subject, m.payload, m.headers, permit_by=deadline))
            if replies:
                await asyncio.wait(replies, timeout=max(0.0, deadline - loop.time()))
            results = [_pub_ack_error(_reply(r)) for r in replies]
        finally:
            for r in replies:
                r.cancel()  # no-op once done; else its permit comes back
        self._after(results)
        return results

    async def publish_atomic(
        self, messages: Sequence[Outgoing], timeout: float
    ) -> list[BaseException | None]:
        """Publish in batches: fast-ingest where ensure_streams chose them, else atomic (all or
        nothing), and fewer than ATOMIC_BATCH_MIN one by one, as a batch is slower to answer. A batch
        is refused whole for a known Nats-Msg-Id, so only first attempts belong here."""
        if self.fast and len(messages) > 1:
            return await self.publish_fast(messages, timeout)
        if not self.atomic or len(messages) < ATOMIC_BATCH_MIN:
            return await self.publish_many(messages, timeout)
        return await self.publish_batches(messages, timeout)

    async def publish_batches(
        self, messages: Sequence[Outgoing], timeout: float
    ) -> list[BaseException | None]:
        """publish_atomic's atomic batches, whatever the choice and the count (probe.py)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout  # the fallback below shares it: the caller's timeout is all there is
        chunks = [messages[i : i + ATOMIC_BATCH_MAX] for i in range(0, len(messages), ATOMIC_BATCH_MAX)]
        commits: list[asyncio.Future[Msg]] = []
        try:
            for chunk in chunks:
                commits.append(await self._send_batch(chunk))
            await asyncio.wait(commits, timeout=max(0.0, deadline - loop.time()))
            replies = [_reply(c) for c in commits]
        finally:
            for c in commits:
                c.cancel()
        results: list[BaseException | None] = []
        for chunk, reply in zip(chunks, replies, strict=True):
            if isinstance(reply, BaseException):
                results += [reply] * len(chunk)
            elif (error := batch_ack_error(reply.data, len(chunk))) is None:
                results += [None] * len(chunk)
            else:
                # Only the stream's refusal turns batching off; any other error is this batch's.
                if error.get("err_code") == ERR_ATOMIC_DISABLED:
                    self.atomic = False
                    log.warning(
                        "atomic publish off", extra={"action": "atomic_publish_off", "error": str(error)}
                    )
                results += await self.publish_many(chunk, max(0.0, deadline - loop.time()))
        self._after(results)
        return results

    async def publish_fast(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        """Publish in fast-ingest batches; for each message, None once stored (or its Nats-Msg-Id
        already was), else why not. Those after a refused one go again one by one."""
        assert self.nc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        batches: list[FastBatch] = []
        try:
            for i in range(0, len(messages), ATOMIC_BATCH_MAX):
                chunk = [(m.subject, m.payload, m.headers) for m in messages[i : i + ATOMIC_BATCH_MAX]]
                batches.append(await self._fast.send(self.nc, chunk))
            await asyncio.wait([b.done for b in batches], timeout=max(0.0, deadline - loop.time()))
        finally:
            self._fast.forget(batches)
        results: list[BaseException | None] = []
        again: list[int] = []  # places in `messages` of those to send one by one
        for b in batches:
            for seq in range(1, b.size + 1):
                result = b.result(seq)
                if result is AGAIN:
                    again.append(len(results))
                    results.append(None)
                else:
                    results.append(result)
            if b.disabled and self.fast:
                self.fast = False  # the stream's owner took allow_batched away
                log.warning(
                    "fast ingest off",
                    extra={"action": "fast_ingest_off", "stream": self.settings.event_stream},
                )
        if again:
            retried = await self.publish_many([messages[i] for i in again], max(0.0, deadline - loop.time()))
            for i, result in zip(again, retried, strict=True):
                results[i] = result
        self._after(results)
        return results

    async def _send_batch(self, chunk: Sequence[Outgoing]) -> asyncio.Future[Msg]:
        """Send one atomic batch; its commit's reply (failed at once if it could not be sent)."""
        assert self.nc is not None
        batch_id = uuid.uuid4().hex
        try:
            await publish_all(self.nc, atomic_batch_head(chunk, batch_id))
        except Exception as exc:  # the server drops a batch never committed
            return _failed(exc)
        last = chunk[-1]
        headers = atomic_batch_headers(last.headers, batch_id, len(chunk), commit=True)
        return await self._send(last.subject, last.payload, headers)

    async def _send(
        self, subject: str, payload: bytes, headers: dict[str, str], permit_by: float | None = None
    ) -> asyncio.Future[Msg]:
        """Publish with a reply subject; the reply's future. With `permit_by`, first take a permit
        (failing the publish if none is free by then); done, failed or cancelled, it comes back."""
        if permit_by is not None and not self.permits.locked():
            await self.permits.acquire()  # free: taken at once, without arming a timer
        elif permit_by is not None:
            try:
                async with asyncio.timeout_at(permit_by):
                    await self.permits.acquire()
            except TimeoutError:
                return _failed(
                    TimeoutError("TIMER_MAX_IN_FLIGHT publishes awaiting a PubAck until the timeout")
                )
        assert self.nc is not None
        token = str(next(self._tokens))
        reply: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._replies[token] = reply
        reply.add_done_callback(functools.partial(self._forget, token, permit_by is not None))
        try:
            await self.nc.publish(subject, payload, reply=self._reply_prefix + token, headers=headers)
        except Exception as exc:  # not connected and the outbound buffer full, connection closed...
            reply.set_exception(exc)
        except BaseException:
            reply.cancel()
            raise
        return reply

    def _forget(self, token: str, permit: bool, _: asyncio.Future[Msg]) -> None:
        del self._replies[token]
        if permit:
            self.permits.release()

    async def _on_reply(self, msg: Msg) -> None:
        reply = self._replies.get(msg.subject[len(self._reply_prefix) :])
        if reply is not None and not reply.done():
            reply.set_result(msg)

    def _after(self, results: list[BaseException | None]) -> None:
        if any(r is not None for r in results):  # a deleted stream looks like this too
            self._on_failure()


def _reply(reply: asyncio.Future[Msg]) -> Msg | BaseException:
    """The reply to a publish, or why there is none."""
    if not reply.done():
        return TimeoutError("no PubAck before the publish timeout")
    if (exc := reply.exception()) is not None:
        return exc
    msg = reply.result()
    if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
        return NoStreamResponseError()  # no stream takes the subject
    return msg


def _pub_ack_error(msg: Msg | BaseException) -> BaseException | None:
    if isinstance(msg, BaseException):
        return msg
    try:
        ack = json.loads(msg.data)
    except ValueError:
        return APIError(description=f"unreadable PubAck: {msg.data[:100]!r}")
    return api_error(ack["error"]) if "error" in ack else None


def _failed(exc: BaseException) -> asyncio.Future[Msg]:
    f: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
    f.set_exception(exc)
    return f
