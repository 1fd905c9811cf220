"""The NATS JetStream adapter: connection, streams, the shared command consumer, publishing."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from worker.contract import Outgoing, Subjects

if TYPE_CHECKING:  # the producer client imports this module without the service's settings
    from worker.config import Settings

log = logging.getLogger("worker.broker")

# The command consumer's redelivery delay for an unacknowledged command (see ensure_streams).
ACK_WAIT_S = 10
# JetStream's limit on messages in one atomic batch.
ATOMIC_BATCH_MAX = 1000
# Fewer messages than this go one by one (see publish_atomic).
ATOMIC_BATCH_MIN = 100
# "atomic publish batch contains duplicate message id": some of it is stored already.
ERR_BATCH_DUPLICATE_ID = 10201


def _tls_context(s: Settings) -> ssl.SSLContext | None:
    if not (s.nats_tls_ca or s.nats_tls_cert or s.nats_url.startswith("tls://")):
        return None
    ctx = ssl.create_default_context(cafile=s.nats_tls_ca)
    if s.nats_tls_cert and s.nats_tls_key:
        ctx.load_cert_chain(s.nats_tls_cert, s.nats_tls_key)
    return ctx


def connect_options(s: Settings) -> dict[str, Any]:
    """nats.connect() keyword arguments for these settings (credentials, TLS, reconnects)."""
    opts: dict[str, Any] = {
        "servers": [u.strip() for u in s.nats_url.split(",")],
        "name": s.worker_id,
        "max_reconnect_attempts": -1,  # a replica waits out a NATS outage; readiness says so
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
        "allow_reconnect": True,
    }
    if s.nats_user:
        opts["user"] = s.nats_user
    if s.nats_password:
        opts["password"] = s.nats_password.get_secret_value()
    if s.nats_token:
        opts["token"] = s.nats_token.get_secret_value()
    if s.nats_nkey_seed:
        opts["nkeys_seed_str"] = s.nats_nkey_seed.get_secret_value()
    if s.nats_creds:
        opts["user_credentials"] = s.nats_creds
    if ctx := _tls_context(s):
        opts["tls"] = ctx
        if s.nats_tls_server_name:
            opts["tls_hostname"] = s.nats_tls_server_name
    return opts


class _TlsEnforcingClient(NATS):
    """nats-py upgrades to TLS only when the server's INFO says `tls_required`: with TLS configured,
    a plaintext server (or one that merely allows TLS, or a man in the middle rewriting INFO) would
    get our CONNECT, credentials included, in clear. This client refuses instead."""

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        wants_tls = self.options.get("tls") is not None and not self.options.get("tls_handshake_first")
        if initial_connection and wants_tls and not info.get("tls_required"):
            raise nats.errors.Error(
                "nats: TLS is configured but the server does not require it; not connecting in clear"
            )
        await super()._process_info(info, initial_connection)


async def nats_connect(servers: str | list[str], **options: Any) -> NATS:
    """nats.connect(), but never in clear when TLS is configured."""
    nc = _TlsEnforcingClient()
    await nc.connect(servers, **options)
    return nc


class Broker:
    """One replica's NATS connection and everything it does with JetStream."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self.nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._atomic = True  # until the event stream says it does not allow atomic batches

    async def connect(self) -> None:
        async def on_error(exc: Exception) -> None:
            log.warning("nats error", extra={"action": "nats_error", "error": str(exc)})

        async def on_disconnect() -> None:
            log.warning("nats disconnected", extra={"action": "nats_disconnected"})

        async def on_reconnect() -> None:
            log.info("nats reconnected", extra={"action": "nats_reconnected"})

        opts = connect_options(self.settings)
        self.nc = await nats_connect(
            opts.pop("servers"),
            **opts,
            error_cb=on_error,
            disconnected_cb=on_disconnect,
            reconnected_cb=on_reconnect,
        )
        self._js = self.nc.jetstream(
            timeout=self.settings.publish_timeout_ms / 1000,
            publish_async_max_pending=self.settings.max_in_flight,
        )

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "connect() first"
        return self._js

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    async def ensure_streams(self) -> None:
        """Create the streams and the shared consumer when missing; never rewrite existing ones."""
        s = self.settings
        streams = [
            api.StreamConfig(
                name=s.command_stream,
                subjects=self.subjects.commands,
                retention=api.RetentionPolicy.WORK_QUEUE,
                max_age=s.command_max_age.total_seconds(),
                num_replicas=s.stream_replicas,
                duplicate_window=120,
            ),
            api.StreamConfig(
                name=s.event_stream,
                subjects=[self.subjects.due("*")],
                max_age=s.retention.total_seconds(),
                num_replicas=s.stream_replicas,
                duplicate_window=s.events_duplicate_window.total_seconds(),
                allow_atomic=True,
            ),
            api.StreamConfig(
                name=s.dlq_stream,
                subjects=[self.subjects.dlq("*")],
                max_age=s.retention.total_seconds(),
                num_replicas=s.stream_replicas,
            ),
        ]
        jsm = self.js._jsm
        for config in streams:
            assert config.name is not None
            try:
                await jsm.stream_info(config.name)
            except NotFoundError:
                if not s.create_streams:
                    raise
                await jsm.add_stream(config)
                log.info("stream created", extra={"action": "stream_created", "stream": config.name})
        try:
            await jsm.consumer_info(s.command_stream, s.consumer)
        except NotFoundError:
            await jsm.add_consumer(
                s.command_stream,
                api.ConsumerConfig(
                    durable_name=s.consumer,
                    ack_policy=api.AckPolicy.EXPLICIT,
                    # Commands a replica fetched and then died with (or lost its connection
                    # before acknowledging) go to another after this: their timers are stored
                    # that much later. A batch takes at most ~8 s (5 s of retries, a DLQ publish);
                    # a redelivery of one still in hand changes nothing (commands are idempotent).
                    ack_wait=ACK_WAIT_S,
                    max_ack_pending=50_000,
                    max_deliver=-1,
                    filter_subjects=self.subjects.commands,
                ),
            )

    async def command_subscription(self) -> JetStreamContext.PullSubscription:
        return await self.js.pull_subscribe_bind(self.settings.consumer, self.settings.command_stream)

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        """Publish with bounded pipelining; for each message, None once JetStream acknowledged it.

        nats-py's publish_async futures can wait forever when a reply is lost, so every future
        gets the same deadline; whatever has not been acknowledged by then counts as failed.
        """
        futures: list[asyncio.Future[api.PubAck]] = []
        results: list[BaseException | None] = []
        for m in messages:
            try:
                futures.append(await self.js.publish_async(m.subject, m.payload, headers=m.headers))
            except Exception as exc:  # not connected, or too many stalled: fail the rest of them
                futures.append(_failed(exc))
        if futures:
            await asyncio.wait(futures, timeout=timeout)
        for f in futures:
            if not f.done():
                f.cancel()
                results.append(TimeoutError("no PubAck before the publish timeout"))
            else:
                results.append(f.exception())
        return results

    async def publish_atomic(
        self, messages: Sequence[Outgoing], timeout: float
    ) -> list[BaseException | None]:
        """Publish in JetStream atomic batches (one PubAck per batch of up to 1,000, all or nothing).

        An order of magnitude cheaper than one PubAck per message, above all with fsync on every
        write. A batch holding a Nats-Msg-Id the stream already has is refused whole, so only
        first attempts should come here; a refused batch is sent again one by one, which dedupes.
        A stream made without allow_atomic turns batching off for this connection.

        A batch's PubAck comes after the server made it durable (many times one message's PubAck:
        docs/BENCHMARKS.md, "Where the time went", step 5), so a few messages go one by one:
        batches are for throughput, small sends for latency.
        """
        if not self._atomic or len(messages) < ATOMIC_BATCH_MIN:
            return await self.publish_many(messages, timeout)
        chunks = [messages[i : i + ATOMIC_BATCH_MAX] for i in range(0, len(messages), ATOMIC_BATCH_MAX)]
        commits = [asyncio.ensure_future(await self._send_batch(chunk)) for chunk in chunks]
        await asyncio.wait(commits, timeout=timeout)
        results: list[BaseException | None] = []
        for chunk, commit in zip(chunks, commits, strict=True):
            if not commit.done():
                commit.cancel()
                results += [TimeoutError("no PubAck for the batch before the publish timeout")] * len(chunk)
            elif (exc := commit.exception()) is not None:
                results += [exc] * len(chunk)
            elif (error := _batch_error(commit.result().data, len(chunk))) is None:
                results += [None] * len(chunk)
            else:
                if error.get("err_code") != ERR_BATCH_DUPLICATE_ID:
                    self._atomic = False
                    log.warning(
                        "atomic publish off", extra={"action": "atomic_publish_off", "error": str(error)}
                    )
                results += await self.publish_many(chunk, timeout)
        return results

    async def _send_batch(self, chunk: Sequence[Outgoing]) -> Awaitable[Msg]:
        """Send one batch; the commit's reply, to await."""
        assert self.nc is not None
        batch_id = uuid.uuid4().hex
        last = len(chunk)
        for seq, m in enumerate(chunk, start=1):
            headers = {**m.headers, "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq)}
            if seq < last:
                await self.nc.publish(m.subject, m.payload, headers=headers)
            else:
                headers["Nats-Batch-Commit"] = "1"
                timeout = self.settings.publish_timeout_ms / 1000
                return self.nc.request(m.subject, m.payload, timeout=timeout, headers=headers)
        raise ValueError("empty batch")

    async def publish_one(self, message: Outgoing) -> None:
        await self.js.publish(message.subject, message.payload, headers=message.headers)

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]], queue: str = "") -> None:
        assert self.nc is not None
        await self.nc.subscribe(subject, queue=queue, cb=cb)

    async def hint(self, subject: str, payload: bytes) -> None:
        if self.nc is not None and self.nc.is_connected:
            await self.nc.publish(subject, payload)

    async def close(self) -> None:
        if self.nc is not None and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout=5)
            except Exception:  # drain on a broken connection: closing is all that is left
                await self.nc.close()


def _batch_error(reply: bytes, size: int) -> dict[str, Any] | None:
    """None when the commit's PubAck confirms the whole batch; else the error it carries."""
    try:
        ack = json.loads(reply)
    except ValueError:
        return {"description": f"unreadable batch PubAck: {reply[:100]!r}"}
    if "error" in ack:
        return dict(ack["error"])
    if ack.get("count") != size:
        return {"description": f"batch PubAck counts {ack.get('count')} of {size}"}
    return None


def _failed(exc: BaseException) -> asyncio.Future[api.PubAck]:
    f: asyncio.Future[api.PubAck] = asyncio.get_running_loop().create_future()
    f.set_exception(exc)
    return f
