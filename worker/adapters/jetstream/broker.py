"""The NATS JetStream adapter: the connection, its readiness, the streams' upkeep, the command
subscription; publishing is publisher.py's, the streams are streams.py's."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import SlowConsumerError
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, NotFoundError

from worker.adapters.jetstream.options import connect_options
from worker.adapters.jetstream.probe import fast_batches_cheaper, probe_stream
from worker.adapters.jetstream.publisher import Publisher
from worker.adapters.jetstream.streams import (
    SUCCESSOR,
    CommandFeed,
    CommandStreams,
    check_limits,
    check_sizes,
    command_filter,
    consumer_config,
    event_batches,
    probe_wanted,
    server_has_fast_ingest,
    stream_configs,
)
from worker.client.closing import Drainable, close_within
from worker.client.wire import nats_connect
from worker.contract import MessageIds, Outgoing, Subjects
from worker.errors import ConfigError, TransientError
from worker.logs import Throttled

if TYPE_CHECKING:
    from worker.config import Settings

log = logging.getLogger(__name__)

# After a failure a missing stream would explain, the streams are looked at no more often than this.
CHECK_INTERVAL_S = 1.0
# How often each replica purges acknowledged commands from a limits command stream (tend_commands).
PURGE_INTERVAL_S = 1.0


class _Handing:
    """A subscription whose callback hands its messages on: drained, then `then` awaited."""

    def __init__(self, sub: Subscription, then: Callable[[], Awaitable[None]]) -> None:
        self.sub, self.then = sub, then

    async def drain(self) -> None:
        await self.sub.drain()  # type: ignore[no-untyped-call]
        await self.then()


class Broker:
    """One replica's NATS connection and everything it does with JetStream."""

    # Every Nats-Msg-Id it publishes with: set from the fleet secret before any loop starts.
    ids: MessageIds

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.subjects = Subjects(settings.subject_prefix)
        self.nc: NATS | None = None
        self._js: JetStreamContext | None = None
        self.publisher = Publisher(settings, on_failure=self.check_streams_soon)
        # Why the streams cannot be used; None when fine.
        self.problem: str | None = None
        self._check: asyncio.Task[None] | None = None
        self._checked_at = float("-inf")
        self.commands = CommandStreams(settings)
        # Fast-ingest batches measured the cheaper on this server (probe.py); None: not measured.
        self._cheaper: bool | None = None
        self._probe: asyncio.Task[None] | None = None
        self._subscriptions: list[Drainable] = []  # core NATS ones (get, wake): drained on close
        # No filter on the shared consumer: tend_once watches the stream for a subject not a command.
        self._unfiltered = False

    @property
    def permits(self) -> asyncio.Semaphore:
        """Publishes awaiting their PubAck (TIMER_MAX_IN_FLIGHT)."""
        return self.publisher.permits

    @property
    def command_stream(self) -> str:
        """The command stream intake reads: the configured one or its successor (ensure_streams)."""
        return self.commands.command_stream

    @property
    def draining(self) -> str | None:
        """The old command stream still drained after a cut-over; None when there is none."""
        return self.commands.draining

    async def connect(self) -> None:
        # nats-py reports each message a subscription drops as a slow consumer's: one a message.
        slow = Throttled(log)

        async def on_error(exc: Exception) -> None:
            extra = {"action": "nats_error", "error": str(exc)}
            if isinstance(exc, SlowConsumerError):
                slow.warning("nats error", extra)
            else:
                log.warning("nats error", extra=extra)

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
        await self.publisher.start(self.nc)

    @property
    def js(self) -> JetStreamContext:
        assert self._js is not None, "connect() first"
        return self._js

    @property
    def connected(self) -> bool:
        return self.nc is not None and self.nc.is_connected

    def stream_configs(self) -> list[api.StreamConfig]:
        """The streams as this service creates them."""
        return stream_configs(self.settings, self.subjects, server_has_fast_ingest(self.nc))

    async def ensure_streams(self) -> None:
        """Create the streams and the shared consumer when missing; never rewrite existing ones.
        TransientError: a stream missing, not ours to create; ConfigError: limits break a guarantee."""
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
        try:
            command = await self.commands.resolve(jsm, found, messages)
        except TransientError as exc:  # its successor is missing
            self._set_problem(str(exc))
            raise
        check_limits(s, found, command)
        check_sizes(s, self.max_payload, found[s.event_stream])
        p, events, fast_ingest = self.publisher, found[s.event_stream], server_has_fast_ingest(self.nc)
        p.fast = event_batches(s, events, fast_ingest, p.fast, self._cheaper)
        if self._probe is None and probe_wanted(s, events, fast_ingest):  # once a process
            self._probe = asyncio.create_task(self._measure(events), name="measure-batches")
        await self._add_command_subjects(jsm, found[command])  # the stream intake reads
        try:
            consumer = (await jsm.consumer_info(command, s.consumer)).config
            await self._filter_consumer(jsm, found[command], consumer)
        except NotFoundError:
            created = consumer_config(s, self.subjects, found[command].subjects or [])
            await jsm.add_consumer(command, created)
            self._unfiltered = not created.filter_subjects
            log.info(
                "consumer created",
                extra={"action": "consumer_created", "consumer": s.consumer, "stream": command},
            )
        self._set_problem(None)

    async def batches_measured(self) -> None:
        """Once the measure of the server's batches is done, if one runs (_measure)."""
        if self._probe is not None:
            await asyncio.shield(self._probe)

    async def _measure(self, events: api.StreamConfig) -> None:
        """In the background, the probe's choice of batches; atomic until then, or if it fails."""
        s = self.settings
        try:
            probe = probe_stream(s, self.subjects, events)
            cheaper = await fast_batches_cheaper(self.js, self.publisher, probe, s.publish_timeout_ms / 1000)
            self._cheaper = cheaper
            self.publisher.fast = event_batches(
                s, events, server_has_fast_ingest(self.nc), self.publisher.fast, cheaper
            )
        except Exception as exc:  # no permission, NATS away: a choice of speed, not of safety
            error = f"{type(exc).__name__}: {exc}"
            log.warning("batches not measured", extra={"action": "batches_not_measured", "error": error})

    async def _add_command_subjects(self, jsm: JetStreamContext, commands: api.StreamConfig) -> None:
        """Add the pause and resume subjects to a command stream made before them: the one setting
        changed in place, only with TIMER_CREATE_STREAMS (docs/OPERATIONS.md)."""
        have = list(commands.subjects or [])
        missing = [x for x in self.subjects.commands if x not in have]
        if not missing or not self.settings.create_streams:
            return
        commands.subjects = [*have, *missing]
        await jsm.update_stream(commands)
        log.info("stream subjects added", extra={"action": "stream_updated", "stream": commands.name})

    async def _filter_consumer(
        self, jsm: JetStreamContext, stream: api.StreamConfig, consumer: api.ConsumerConfig
    ) -> None:
        """Set the shared consumer's filter in place to what streams.command_filter wants now, so it
        never takes a message that is not a command; only with TIMER_CREATE_STREAMS."""
        have = consumer.filter_subjects or ([consumer.filter_subject] if consumer.filter_subject else [])
        want = command_filter(self.subjects, stream.subjects or []) or []
        if sorted(have) == sorted(want) or not self.settings.create_streams:
            self._unfiltered = not have
            return
        await jsm.add_consumer(stream.name or "", consumer, filter_subject=None, filter_subjects=want or None)
        self._unfiltered = not want
        log.info(
            "consumer filter changed",
            extra={"action": "consumer_updated", "consumer": self.settings.consumer, "filter": want},
        )

    def _set_problem(self, problem: str | None) -> None:
        if problem != self.problem and problem is not None:
            log.warning("streams not usable", extra={"action": "streams_not_ready", "error": problem})
        self.problem = problem

    def check_streams_soon(self) -> None:
        """In the background, recreate what a failure says may be missing, or say in `problem` why not."""
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
        assert self.nc is not None, "connect() first"
        return CommandFeed(self.nc, self.settings.consumer, self.commands)

    async def tend_commands(self, stop: asyncio.Event) -> None:
        """Until stop, about once a second: purge acknowledged commands and follow a cut-over."""
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
        watch_cut_over = self.command_stream == s.command_stream and not self.commands.purging
        if watch_cut_over or self._unfiltered:
            # A work queue: watch it for a cut-over; an unfiltered consumer: for a subject bound since.
            try:
                config = (await self.js.stream_info(self.command_stream)).config
            except NotFoundError:  # intake's failed fetch puts it back
                config = None
            if config is not None and (
                (watch_cut_over and (config.metadata or {}).get(SUCCESSOR))
                or (self._unfiltered and command_filter(self.subjects, config.subjects or []))
            ):
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
                self.commands.draining = None
        if self.commands.purging:
            await self.purge_acknowledged()

    async def purge_acknowledged(self) -> int:
        """Purge the commands below the shared consumer's ack floor; how many went."""
        assert self.nc is not None
        return await self.commands.purge_acknowledged(self.nc, self.js)

    # Publishing (the EventPublisher port): publisher.Publisher says how.
    async def publish_many(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        return await self.publisher.publish_many(messages, timeout)

    async def publish_atomic(
        self, messages: Sequence[Outgoing], timeout: float
    ) -> list[BaseException | None]:
        return await self.publisher.publish_atomic(messages, timeout)

    async def publish_fast(self, messages: Sequence[Outgoing], timeout: float) -> list[BaseException | None]:
        return await self.publisher.publish_fast(messages, timeout)

    async def subscribe(
        self,
        subject: str,
        cb: Callable[[Msg], Awaitable[None]],
        queue: str = "",
        then: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """A core NATS subscription, drained on close; `then`, if given, awaited after the drain."""
        assert self.nc is not None
        sub = await self.nc.subscribe(subject, queue=queue, cb=cb)
        self._subscriptions.append(sub if then is None else _Handing(sub, then))

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (NATS's default until connected)."""
        return self.nc.max_payload if self.nc is not None else 1024 * 1024

    async def hint(self, subject: str, payload: bytes) -> None:
        if self.nc is not None and self.nc.is_connected:
            await self.nc.publish(subject, payload)

    async def close(self, timeout: float = 5.0) -> bool:
        """Drain the subscriptions, flush and close within `timeout` whatever the server does;
        whether all that was done."""
        for task in (self._check, self._probe):
            if task is not None:
                task.cancel()
        if self.nc is None or self.nc.is_closed:
            return True
        return await close_within(self.nc, timeout, self._subscriptions)
