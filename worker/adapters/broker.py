"""The NATS JetStream adapter: connection, streams, the shared command consumer, publishing."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, BadRequestError, NoStreamResponseError, NotFoundError

from worker import metrics
from worker.contract import MessageIds, Outgoing, Subjects
from worker.errors import ConfigError, TransientError
from worker.natsconn import (
    ATOMIC_BATCH_MAX,
    ERR_ATOMIC_DISABLED,
    atomic_batch_headers,
    batch_ack_error,
    nats_connect,
)

if TYPE_CHECKING:
    from worker.config import Settings

log = logging.getLogger("worker.broker")

# The command consumer's redelivery delay for an unacknowledged command (see ensure_streams).
ACK_WAIT_S = 10
# Fewer messages than this go one by one (see publish_atomic).
ATOMIC_BATCH_MIN = 100
# Fast-ingest batch publish (ADR-50's "fast" batches, allow_batched streams) came with this server.
FAST_INGEST_SINCE = (2, 14)
# "batch publish is disabled": the events stream has no allow_batched (any more).
ERR_BATCH_DISABLED = 10205
# Errors that say nothing against a message, only against its batch (disabled, pattern invalid,
# batch id invalid or unknown, too many batches in flight): such a message goes again one by one.
ERR_BATCH_ONLY = {ERR_BATCH_DISABLED, 10206, 10207, 10208, 10211}
# The flow-control ack the server may send every N stored messages of a fast batch, at most: what
# a batch cut short by a timeout keeps (see publish_fast). 500 is the server's own ceiling.
FAST_FLOW = 500
# nats-py knows the allow_batched stream setting since 2.13 (the oldest supported, 2.12, does not:
# with it, events go in atomic batches).
CLIENT_KNOWS_BATCHED = "allow_batched" in {f.name for f in dataclasses.fields(api.StreamConfig)}
# After a failure a missing stream would explain, the streams are looked at no more often than this.
CHECK_INTERVAL_S = 1.0
# How often each replica purges acknowledged commands from a limits command stream (tend_commands).
PURGE_INTERVAL_S = 1.0
# Stream metadata a retired command stream carries: the stream that took its subjects over
# (timer-service migrate-streams). Replicas follow it, and drain the old stream meanwhile.
SUCCESSOR = "timer-service.successor"
# While an old command stream drains, each fetch looks at it this long before the new one.
DRAIN_FETCH_S = 0.05


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
        # What nats-py holds while reconnecting; past it a publish fails at once (it is retried).
        "pending_size": s.publish_buffer_bytes,
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


class Broker:
    """One replica's NATS connection and everything it does with JetStream."""

    # Every Nats-Msg-Id it publishes with: set by the replica from the fleet secret before any
    # loop starts (service.Replica._connect).
    ids: MessageIds

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self.nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self._atomic = True  # until the event stream says it does not allow atomic batches
        self._fast = False  # events in fast-ingest batches: decided by ensure_streams
        self._fast_prefix = ""
        self._fast_batches: dict[str, _FastBatch] = {}
        # Publishes awaiting their PubAck. Ours, not nats-py's publish_async: that one keeps a
        # permit for good when the publish itself raises (its outbound buffer full in an outage),
        # and after TIMER_MAX_IN_FLIGHT of those every publish waited forever.
        self.permits = asyncio.Semaphore(settings.max_in_flight)
        self._replies: dict[str, asyncio.Future[Msg]] = {}
        self._reply_prefix = ""
        self._tokens = itertools.count()
        # Why the streams cannot be used (missing and not ours to create, or refused); None when fine.
        self.problem: str | None = None
        self._check: asyncio.Task[None] | None = None
        self._checked_at = float("-inf")
        # The command stream intake reads (ensure_streams: the configured one or its successor),
        # and the old one it still drains after a cut-over (None when there is none).
        self.command_stream = settings.command_stream
        self.draining: str | None = None
        self._purging = False  # a limits command stream: acknowledged commands are ours to purge
        self._purged = 0  # the ack floor up to which this replica last purged
        self._told_work_queue = False

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
        self._js = self.nc.jetstream(timeout=self.settings.publish_timeout_ms / 1000)
        self._reply_prefix = f"{self.nc.new_inbox()}."
        await self.nc.subscribe(f"{self._reply_prefix}*", cb=self._on_reply)
        # A fast batch's replies come to the reply subject of the message that prompted them,
        # which holds the batch's id, flow, gap mode, sequence and operation (publish_fast).
        self._fast_prefix = f"{self.nc.new_inbox()}."
        await self.nc.subscribe(f"{self._fast_prefix}>", cb=self._on_fast_reply)

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "connect() first"
        return self._js

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def stream_configs(self) -> list[api.StreamConfig]:
        """The streams as this service creates them."""
        s = self.settings
        configs = [
            api.StreamConfig(
                name=s.command_stream,
                subjects=self.subjects.commands,
                # Limits, not a work queue: there every acknowledgement deletes its message, one
                # durable write (a fsync under sync_interval: always) per command; here an
                # acknowledgement only moves the consumer's ack floor, flushed a few times a
                # second, and tend_commands purges below the floor about once a second.
                retention=api.RetentionPolicy.LIMITS,
                max_age=s.command_max_age.total_seconds(),
                num_replicas=s.stream_replicas,
                duplicate_window=120,
                # Producers may send commands in atomic batches (TimerClient.schedule_many).
                allow_atomic=True,
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
        # Fast-ingest batches only where the server knows them: a stream with allow_batched needs
        # API level 4 (2.14), and an older server would ignore the flag anyway.
        if self._server_has_fast_ingest():
            configs[1].allow_batched = True
        return configs

    async def ensure_streams(self) -> None:
        """Create the streams and the shared consumer when missing; never rewrite existing ones.

        Raises TransientError naming a stream that is missing with TIMER_CREATE_STREAMS=false, and
        ConfigError when an existing stream's limits break a guarantee (see _check_limits).
        """
        s = self.settings
        jsm = self.js  # a JetStreamContext is a JetStreamManager (public API)
        found: dict[str, api.StreamConfig] = {}
        messages: dict[str, int] = {}
        for config in self.stream_configs():
            assert config.name is not None
            try:
                info = await jsm.stream_info(config.name)
            except NotFoundError:
                if not s.create_streams:
                    self._set_problem(f"stream {config.name} does not exist (TIMER_CREATE_STREAMS=false)")
                    raise TransientError(self.problem) from None
                try:
                    info = await jsm.add_stream(config)
                except BadRequestError as exc:
                    raise ConfigError(f"stream {config.name}: cannot be created: {exc.description}") from None
                log.info("stream created", extra={"action": "stream_created", "stream": config.name})
            found[config.name] = info.config
            messages[config.name] = info.state.messages
        command = await self._resolve_commands(found, messages)
        self._check_limits(found, command)
        self._choose_event_batches(found[s.event_stream])
        await self._add_command_subjects(jsm, found[command])  # the stream intake reads
        try:
            consumer = (await jsm.consumer_info(command, s.consumer)).config
            await self._add_consumer_subjects(jsm, command, consumer)
        except NotFoundError:
            await jsm.add_consumer(command, consumer_config(self.settings, self.subjects))
            log.info(
                "consumer created",
                extra={"action": "consumer_created", "consumer": s.consumer, "stream": command},
            )
        self._set_problem(None)

    async def _resolve_commands(self, found: dict[str, api.StreamConfig], messages: dict[str, int]) -> str:
        """The stream intake reads: the configured one, or the one `timer-service migrate-streams`
        moved its subjects to (named in its metadata). The old one is drained while it holds
        commands. Adds the successor's config to `found`; never creates it (its sequence numbers
        must continue the old stream's, which only the migration knows to do)."""
        s = self.settings
        configured = found[s.command_stream]
        successor = (configured.metadata or {}).get(SUCCESSOR)
        if successor is None:
            self.command_stream, self.draining = s.command_stream, None
        else:
            try:
                found[successor] = (await self.js.stream_info(successor)).config
            except NotFoundError:
                self._set_problem(
                    f"stream {successor}, which took over {s.command_stream}'s subjects, does not exist"
                    " (run timer-service migrate-streams again)"
                )
                raise TransientError(self.problem) from None
            if self.command_stream != successor:
                log.info(
                    "command stream moved",
                    extra={"action": "command_stream_moved", "stream": successor, "from": s.command_stream},
                )
            self.command_stream = successor
            self.draining = s.command_stream if messages[s.command_stream] else None
        retention = found[self.command_stream].retention
        self._purging = retention == api.RetentionPolicy.LIMITS
        if retention == api.RetentionPolicy.WORK_QUEUE and not self._told_work_queue:
            self._told_work_queue = True
            log.warning(
                "command stream is a work queue",
                extra={
                    "action": "command_stream_work_queue",
                    "stream": self.command_stream,
                    "detail": "one durable write per acknowledged command; timer-service migrate-streams"
                    " moves it to limits retention (docs/OPERATIONS.md, Upgrading)",
                },
            )
        return self.command_stream

    async def _add_command_subjects(self, jsm: JetStreamContext, commands: api.StreamConfig) -> None:
        """The pause and resume subjects came after schedule and cancel: a command stream created
        before them binds only those two, and a pause sent to it would be refused by JetStream (no
        stream). Its subject list is the one setting changed in place (JetStream allows it; nothing
        stored moves);
        every other limit stays as the operator left it. Only with TIMER_CREATE_STREAMS (otherwise
        the operator adds them: docs/OPERATIONS.md)."""
        have = list(commands.subjects or [])
        missing = [x for x in self.subjects.commands if x not in have]
        if not missing or not self.settings.create_streams:
            return
        commands.subjects = [*have, *missing]
        await jsm.update_stream(commands)
        log.info("stream subjects added", extra={"action": "stream_updated", "stream": commands.name})

    async def _add_consumer_subjects(
        self, jsm: JetStreamContext, stream: str, consumer: api.ConsumerConfig
    ) -> None:
        """The shared consumer's filter, likewise: created before pause and resume, it would never
        deliver a pause. A durable's filter_subjects may change in place (NATS 2.10); its pending
        commands stay."""
        have = list(
            consumer.filter_subjects or ([consumer.filter_subject] if consumer.filter_subject else [])
        )
        missing = [x for x in self.subjects.commands if x not in have]
        if not have or not missing or not self.settings.create_streams:
            return  # no filter at all: it takes every subject of the stream already
        await jsm.add_consumer(stream, consumer, filter_subject=None, filter_subjects=[*have, *missing])
        log.info(
            "consumer subjects added",
            extra={"action": "consumer_updated", "consumer": self.settings.consumer},
        )

    def _check_limits(self, streams: dict[str, api.StreamConfig], command: str) -> None:
        """The guarantees that rest on the streams' own limits, which may not be what settings say
        (a stream made by hand, or before a setting changed): refuse, naming the stream, if one fails."""
        s = self.settings
        events = streams[s.event_stream]
        horizon = timedelta(milliseconds=s.lease_ms + 3 * s.publish_timeout_ms)
        window = timedelta(seconds=events.duplicate_window or 0)
        if window <= horizon:
            raise ConfigError(
                f"stream {s.event_stream}: duplicate window {_age(window)} must exceed TIMER_LEASE_MS"
                f" + 3 x TIMER_PUBLISH_TIMEOUT_MS ({_age(horizon)}), or a re-fired timer is published twice"
            )
        # A finished timer's row must outlive every copy of the command that made it (retention.py).
        command_age = timedelta(seconds=streams[command].max_age or 0)
        if not command_age or command_age > s.retention:
            raise ConfigError(
                f"stream {command}: max age {_age(command_age)} must not exceed TIMER_RETENTION"
                f" ({_age(s.retention)}), or a late duplicate ScheduleTimer re-arms a deleted timer"
            )

    def _server_has_fast_ingest(self) -> bool:
        if not CLIENT_KNOWS_BATCHED or self.nc is None or not self.nc.is_connected:
            return False
        try:
            version = self.nc.connected_server_version
            return (version.major, version.minor) >= FAST_INGEST_SINCE
        except (TypeError, ValueError, AttributeError):  # no version in the server's INFO
            return False

    def _choose_event_batches(self, events: api.StreamConfig) -> None:
        """Fast-ingest or atomic batches for events, from TIMER_EVENTS_FAST_INGEST, the server and
        the stream as it exists. An events stream made before (or by hand) without allow_batched
        is not changed: events go in atomic batches until its owner turns the flag on (docs/OPERATIONS.md).

        A fast batch stores each message as it comes, so on a single server under
        `sync_interval: always` it costs an fsync per event, where an atomic batch costs one per
        batch; a replicated stream writes through its Raft log either way. "auto" therefore
        takes fast batches on replicated streams only (on a single server that keeps its
        guarantees, sync_interval is always: README, Guarantees).
        """
        mode = self.settings.events_fast_ingest
        allowed = bool(getattr(events, "allow_batched", False)) and self._server_has_fast_ingest()
        replicated = (events.num_replicas or 1) > 1
        fast = allowed and (mode == "on" or (mode == "auto" and replicated))
        if fast != self._fast or (mode == "on" and not allowed):
            log.info(
                "event batches",
                extra={
                    "action": "event_batches",
                    "mode": "fast_ingest" if fast else "atomic",
                    "stream": events.name,
                    "allow_batched": bool(getattr(events, "allow_batched", False)),
                },
            )
        self._fast = fast

    def _set_problem(self, problem: str | None) -> None:
        if problem != self.problem and problem is not None:
            log.warning("streams not usable", extra={"action": "streams_not_ready", "error": problem})
        self.problem = problem

    def check_streams_soon(self) -> None:
        """After a failure a missing stream or consumer would explain: in the background, recreate
        what is missing (as at start-up), or record in `problem` why the streams cannot be used."""
        if not self.connected or (self._check is not None and not self._check.done()):
            return
        if time.monotonic() - self._checked_at < CHECK_INTERVAL_S:
            return
        self._checked_at = time.monotonic()
        self._check = asyncio.create_task(self._check_streams(), name="check-streams")

    async def _check_streams(self) -> None:
        try:
            await self.ensure_streams()
        except ConfigError as exc:
            self._set_problem(str(exc))
        except TransientError:  # missing and not ours to create: `problem` says so
            pass
        except Exception as exc:  # NATS cannot answer now (a leader election, a lost connection)
            log.warning("stream check failed", extra={"action": "stream_check_failed", "error": str(exc)})

    async def command_subscription(self) -> CommandFeed:
        return CommandFeed(self)

    async def tend_commands(self, stop: asyncio.Event) -> None:
        """Until stop, about once a second: purge acknowledged commands from a limits command
        stream, follow a cut-over (migrate-streams) and notice when the old stream has drained.
        Never ends on an error: the next round tries again."""
        while not stop.is_set():
            try:
                await self.tend_once()
            except Exception as exc:  # NATS cannot answer now: nothing is lost by waiting
                error = f"{type(exc).__name__}: {exc}"
                log.warning("command stream upkeep failed", extra={"action": "purge_failed", "error": error})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), PURGE_INTERVAL_S)

    async def tend_once(self) -> None:
        if not self.connected:
            return
        s = self.settings
        if self.command_stream == s.command_stream and not self._purging:
            # A work queue made by an older release: watch it for a cut-over.
            info = await self.js.stream_info(s.command_stream)
            if (info.config.metadata or {}).get(SUCCESSOR):
                await self.ensure_streams()
        if self.draining is not None:
            try:
                left = (await self.js.stream_info(self.draining)).state.messages
            except NotFoundError:
                left = 0
            if not left:  # a retired stream takes no new commands: empty is final
                log.info(
                    "command stream drained",
                    extra={"action": "command_stream_drained", "stream": self.draining},
                )
                self.draining = None
        if self._purging:
            await self.purge_acknowledged()

    async def purge_acknowledged(self) -> int:
        """Remove the commands below the shared consumer's ack floor; how many went.

        The floor is the newest command before which every command is acknowledged, by whichever
        replica; one NAKed with a delay (deferred) or in a replica's hands holds it, so nothing
        unacknowledged is ever purged. Every replica may do this at once: each purges up to a
        floor it read, and floors only move forward. Nothing is sent while the floor stands still.
        """
        try:
            info = await self.js.consumer_info(self.command_stream, self.settings.consumer)
        except NotFoundError:  # intake's failed fetch puts it back
            return 0
        floor = int(info.ack_floor.stream_seq if info.ack_floor else 0)
        if floor <= self._purged:
            return 0
        assert self.nc is not None
        reply = await self.nc.request(
            f"$JS.API.STREAM.PURGE.{self.command_stream}",
            json.dumps({"seq": floor + 1}).encode(),
            timeout=self.settings.publish_timeout_ms / 1000,
        )
        answer = json.loads(reply.data)
        if "error" in answer:
            raise APIError.from_error(answer["error"])
        self._purged = floor
        purged = int(answer.get("purged", 0))
        metrics.COMMANDS_PURGED.inc(purged)
        log.debug(
            "commands purged",
            extra={
                "action": "commands_purged",
                "stream": self.command_stream,
                "count": purged,
                "floor": floor,
            },
        )
        return purged

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        """Publish with bounded pipelining; for each message, None once JetStream acknowledged it.

        Everything, waiting for a permit (TIMER_MAX_IN_FLIGHT) included, ends by the deadline;
        whatever has not been acknowledged by then counts as failed, and every permit comes back.
        """
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
        """Publish in batches: fast-ingest ones where ensure_streams chose them (publish_fast),
        else JetStream atomic batches (one PubAck per batch of up to 1,000, all or nothing).

        An order of magnitude cheaper than one PubAck per message, above all with fsync on every
        write. A batch holding a Nats-Msg-Id the stream already has is refused whole, so only
        first attempts should come here; a refused batch is sent again one by one, which dedupes.
        A stream made without allow_atomic (error 10174) turns batching off for this connection.

        A batch's PubAck comes after the server made it durable (many times one message's PubAck:
        docs/BENCHMARKS.md, "Where the time went", step 5), so a few messages go one by one:
        batches are for throughput, small sends for latency.
        """
        if self._fast and len(messages) > 1:
            return await self.publish_fast(messages, timeout)
        if not self._atomic or len(messages) < ATOMIC_BATCH_MIN:
            return await self.publish_many(messages, timeout)
        chunks = [messages[i : i + ATOMIC_BATCH_MAX] for i in range(0, len(messages), ATOMIC_BATCH_MAX)]
        commits: list[asyncio.Future[Msg]] = []
        try:
            for chunk in chunks:
                commits.append(await self._send_batch(chunk))
            await asyncio.wait(commits, timeout=timeout)
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
                # Only the stream's own refusal turns batching off. Any other error is this
                # batch's (a duplicate id; a reconnect that lost part of it: incomplete, missing
                # sequence): it goes one by one, and the next batch is atomic again.
                if error.get("err_code") == ERR_ATOMIC_DISABLED:
                    self._atomic = False
                    log.warning(
                        "atomic publish off", extra={"action": "atomic_publish_off", "error": str(error)}
                    )
                results += await self.publish_many(chunk, timeout)
        self._after(results)
        return results

    async def publish_fast(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        """Publish in fast-ingest batches (nats-server 2.14+, allow_batched); for each message,
        None once JetStream stored it (or already had its Nats-Msg-Id), else why not.

        The batch information travels in each message's reply subject,
        `<inbox>.<batch id>.<flow>.fail.<sequence>.<operation>.$FI` (0 start, 1 append, 2
        commit), so a stored event carries only its own headers. The server stores each message
        as it comes and skips a duplicate instead of refusing the batch, so retries may come here
        too. Gap mode "fail": the first message the stream refuses (its error comes as
        `{"type":"err","seq":N}`) ends the batch, and the PubAck of the commit says how many
        were stored: `count`. Messages 1..count are stored, the refused one fails with its error,
        and those after it never were: they go again one by one, as does a batch refused whole.
        Without a PubAck by the timeout, the flow acks (`{"type":"ack","seq":N}`: 1..N stored)
        still tell which were stored; the rest fail with TimeoutError and are retried later.
        """
        assert self.nc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        batches: list[_FastBatch] = []
        try:
            for i in range(0, len(messages), ATOMIC_BATCH_MAX):
                batches.append(await self._send_fast(messages[i : i + ATOMIC_BATCH_MAX]))
            await asyncio.wait([b.done for b in batches], timeout=max(0.0, deadline - loop.time()))
        finally:
            for b in batches:
                self._fast_batches.pop(b.id, None)
                b.done.cancel()
        results: list[BaseException | None] = []
        again: list[int] = []  # places in `messages` of those to send one by one
        for b in batches:
            for seq in range(1, b.size + 1):
                result = b.result(seq)
                if result is _AGAIN:
                    again.append(len(results))
                    results.append(None)
                else:
                    results.append(result)
            if b.disabled and self._fast:
                self._fast = False  # the stream's owner took allow_batched away
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

    async def _send_fast(self, chunk: Sequence[Outgoing]) -> _FastBatch:
        """Send one fast batch; its state, which the replies fill in (see _on_fast_reply)."""
        assert self.nc is not None
        batch = _FastBatch(uuid.uuid4().hex, len(chunk), asyncio.get_running_loop().create_future())
        self._fast_batches[batch.id] = batch
        head = f"{self._fast_prefix}{batch.id}.{FAST_FLOW}.fail."
        last = len(chunk)
        try:
            for seq, m in enumerate(chunk, start=1):
                op = 2 if seq == last else 0 if seq == 1 else 1
                await self.nc.publish(m.subject, m.payload, reply=f"{head}{seq}.{op}.$FI", headers=m.headers)
        except Exception as exc:  # not connected and the outbound buffer full...: the server drops the rest
            batch.fail(exc)
        return batch

    async def _on_fast_reply(self, msg: Msg) -> None:
        tokens = msg.subject[len(self._fast_prefix) :].split(".")
        batch = self._fast_batches.get(tokens[0])
        if batch is None or batch.done.done():
            return
        if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
            batch.fail(NoStreamResponseError())  # no stream takes the subject
            return
        try:
            reply = json.loads(msg.data)
            seq = int(tokens[3])
        except (ValueError, IndexError):
            return
        if isinstance(reply, dict):
            batch.on_reply(reply, seq)

    async def _send_batch(self, chunk: Sequence[Outgoing]) -> asyncio.Future[Msg]:
        """Send one atomic batch; its commit's reply (failed at once if it could not be sent)."""
        assert self.nc is not None
        batch_id = uuid.uuid4().hex
        try:
            for seq, m in enumerate(chunk[:-1], start=1):
                headers = atomic_batch_headers(m.headers, batch_id, seq, commit=False)
                await self.nc.publish(m.subject, m.payload, headers=headers)
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
            self.check_streams_soon()

    async def publish_one(self, message: Outgoing) -> None:
        await self.js.publish(message.subject, message.payload, headers=message.headers)

    async def subscribe(self, subject: str, cb: Callable[[Msg], Awaitable[None]], queue: str = "") -> None:
        assert self.nc is not None
        await self.nc.subscribe(subject, queue=queue, cb=cb)

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (NATS's default until connected)."""
        return self.nc.max_payload if self.nc is not None else 1024 * 1024

    async def hint(self, subject: str, payload: bytes) -> None:
        if self.nc is not None and self.nc.is_connected:
            await self.nc.publish(subject, payload)

    async def close(self) -> None:
        if self._check is not None:
            self._check.cancel()
        if self.nc is not None and not self.nc.is_closed:
            try:
                await asyncio.wait_for(self.nc.drain(), timeout=5)
            except Exception:  # drain on a broken connection: closing is all that is left
                with contextlib.suppress(Exception):  # and it may fail the same way
                    await self.nc.close()


def consumer_config(settings: Settings, subjects: Subjects) -> api.ConsumerConfig:
    """The shared command consumer, as the service creates it."""
    return api.ConsumerConfig(
        durable_name=settings.consumer,
        # Explicit acks, never AckAll: the consumer is shared, so acknowledging "everything up to
        # this one" would acknowledge other replicas' commands still being applied.
        ack_policy=api.AckPolicy.EXPLICIT,
        # Commands a replica fetched and then died with (or lost its connection before
        # acknowledging) go to another after this: their timers are stored that much later. A
        # batch takes at most ~8 s (5 s of retries, a DLQ publish); a redelivery of one still in
        # hand changes nothing (commands are idempotent).
        ack_wait=ACK_WAIT_S,
        max_ack_pending=50_000,
        max_deliver=-1,
        filter_subjects=subjects.commands,
    )


async def command_stream_now(js: JetStreamContext, settings: Settings) -> str:
    """The stream that takes commands now: the configured one, or its successor after a cut-over."""
    try:
        info = await js.stream_info(settings.command_stream)
    except NotFoundError:
        return settings.command_stream
    return (info.config.metadata or {}).get(SUCCESSOR) or settings.command_stream


class CommandFeed:
    """The shared consumer's commands, from the stream the broker reads now. After a cut-over,
    while the old stream still holds commands (in flight, or deferred), each fetch looks there
    first, briefly: the old stream's commands come before the new one's in stream order too."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker
        self._subs: dict[str, JetStreamContext.PullSubscription] = {}

    async def _sub(self, stream: str) -> JetStreamContext.PullSubscription:
        if stream not in self._subs:
            self._subs[stream] = await self._broker.js.pull_subscribe_bind(
                self._broker.settings.consumer, stream
            )
        return self._subs[stream]

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        b = self._broker
        for gone in [name for name in self._subs if name not in (b.command_stream, b.draining)]:
            with contextlib.suppress(nats.errors.Error):  # fetched commands can still be acknowledged
                await self._subs.pop(gone).unsubscribe()
        if b.draining is not None:
            try:
                if msgs := await (await self._sub(b.draining)).fetch(batch, timeout=DRAIN_FETCH_S):
                    return msgs
            except (TimeoutError, nats.errors.Error):  # nothing there now; tend_commands sees it go
                pass
        return await (await self._sub(b.command_stream)).fetch(batch, timeout=timeout)

    async def unsubscribe(self) -> None:
        for sub in self._subs.values():
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        self._subs.clear()


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
    return _api_error(ack["error"]) if "error" in ack else None


def _api_error(error: dict[str, Any]) -> APIError:
    """The error a PubAck carries. nats-py's APIError.from_error raises it rather than return it,
    which took a publish_many down with one refused message."""
    try:
        APIError.from_error(error)
    except APIError as exc:
        return exc
    return APIError(description=str(error))  # pragma: no cover  # from_error always raises


def _failed(exc: BaseException) -> asyncio.Future[Msg]:
    f: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
    f.set_exception(exc)
    return f


def _age(d: timedelta) -> str:
    return f"{d.total_seconds():g}s" if d else "unlimited"


# A message of a fast batch the server never stored, though it refused no message of its own
# (a later one of a batch ended by another's error, or all of a batch refused whole): sent again.
_AGAIN = Exception("send again")


@dataclasses.dataclass
class _FastBatch:
    """What the server said so far of one fast batch (Broker.publish_fast)."""

    id: str
    size: int
    done: asyncio.Future[None]
    flowed: int = 0  # the highest flow ack: messages 1..flowed are stored
    count: int | None = None  # the PubAck's: messages 1..count are stored, and the batch ended
    failure: BaseException | None = None  # it could not be sent, or no stream takes it
    errors: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # a refused message's

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.failure = exc
            self.done.set_result(None)

    def on_reply(self, reply: dict[str, Any], seq: int) -> None:
        """One reply, sent to the reply subject of message `seq`."""
        kind = reply.get("type")
        if kind == "ack":
            self.flowed = max(self.flowed, int(reply.get("seq", 0)))
        elif kind == "err":
            self.errors[int(reply.get("seq", 0))] = dict(reply.get("error") or {})
        elif kind is None and "error" in reply:
            # Message `seq` was refused before it joined the batch (too large, limits, the flag
            # off), or the batch is gone (its first message refused: each later one is then
            # "unknown batch"). The batch goes on without it; in gap mode "fail" the next
            # message ends it, and its PubAck says how many were stored.
            self.errors[seq] = dict(reply["error"])
            if len(self.errors) >= self.size:
                self.done.set_result(None)
        elif kind is None and reply.get("batch") == self.id:
            self.count = int(reply.get("count", 0))
            self.done.set_result(None)
        # "gap" is informational: in gap mode "fail" a gap ends the batch, and its PubAck says so.
        # Anything else (a plain PubAck from a server that does not know fast ingest) proves
        # nothing about the batch: its messages time out and are retried, deduplicated.

    @property
    def disabled(self) -> bool:
        return any(e.get("err_code") == ERR_BATCH_DISABLED for e in self.errors.values())

    def result(self, seq: int) -> BaseException | None:
        """Message `seq`'s outcome: None (stored), its error, or _AGAIN."""
        stored = self.count if self.count is not None else self.flowed
        if seq <= stored:
            return None
        if (error := self.errors.get(seq)) is not None:
            return _AGAIN if error.get("err_code") in ERR_BATCH_ONLY else _api_error(error)
        if self.failure is not None:
            return self.failure
        if not self.done.done() or self.done.cancelled():
            return TimeoutError("no PubAck before the publish timeout")
        return _AGAIN
