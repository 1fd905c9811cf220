"""The JetStream streams as this service makes and reads them: configs and their limits, the shared
command consumer, the command stream after a cut-over and its purge, the kind of event batches."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from worker import metrics
from worker.adapters.jetstream.pull import Pull, PullFailed
from worker.client.batches import server_has_fast_ingest as server_has_fast_ingest  # the broker's, from here
from worker.contract import MAX_CARRIED_VALUE_CHARS, Subjects
from worker.core.eventsize import largest_event
from worker.core.ports import FetchFailed
from worker.errors import ConfigError, TransientError

if TYPE_CHECKING:
    from worker.config import Settings

log = logging.getLogger(__name__)

# The command consumer's redelivery delay for an unacknowledged command.
ACK_WAIT_S = 10
# Metadata of a retired command stream: the stream that took its subjects over (migrate-streams).
SUCCESSOR = "timer-service.successor"
# While an old command stream drains, each fetch looks at it this long before the new one.
DRAIN_FETCH_S = 0.05


def stream_configs(s: Settings, subjects: Subjects, fast_ingest: bool) -> list[api.StreamConfig]:
    """The streams as this service creates them."""
    configs = [
        api.StreamConfig(
            name=s.command_stream,
            subjects=subjects.commands,
            # Limits, not a work queue: an acknowledgement only moves the ack floor, not one durable
            # delete per command; tend_commands purges below the floor.
            retention=api.RetentionPolicy.LIMITS,
            max_age=s.command_max_age.total_seconds(),
            num_replicas=s.stream_replicas,
            duplicate_window=120,
            # Producers may batch commands: atomic, and fast-ingest where the server takes them.
            allow_atomic=True,
        ),
        events := _published(s, s.event_stream, subjects.due("*")),
        _published(s, s.dlq_stream, subjects.of("*", "dlq")),
    ]
    events.duplicate_window = s.events_duplicate_window.total_seconds()
    events.allow_atomic = True  # the firing loop publishes first attempts in atomic batches
    # Fast-ingest only where the server knows it (API level 4).
    if fast_ingest:
        configs[0].allow_batched = events.allow_batched = True
    return configs


def _published(s: Settings, name: str, subject: str) -> api.StreamConfig:
    """A stream the service publishes to (the events, the DLQ), kept for TIMER_RETENTION."""
    return api.StreamConfig(
        name=name, subjects=[subject], max_age=s.retention.total_seconds(), num_replicas=s.stream_replicas
    )


def check_limits(s: Settings, streams: dict[str, api.StreamConfig], command: str) -> None:
    """Refuse, naming the stream, limits that break a guarantee: a stream made by hand, or before a
    setting changed, may not keep what the settings say."""
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


def check_sizes(s: Settings, max_payload: int, events: api.StreamConfig) -> None:
    """Refuse, naming the setting to lower, settings under which an accepted timer's event could
    exceed max_payload or the events stream's max_msg_size: it would never fire."""
    limit, what = max_payload, f"the NATS server's max_payload ({max_payload})"
    if events.max_msg_size is not None and 0 < events.max_msg_size < limit:
        limit, what = events.max_msg_size, f"stream {events.name}'s max_msg_size ({events.max_msg_size})"
    largest = largest_event(s.max_payload_bytes, s.carried_names)
    if largest <= limit:
        return
    fits = s.max_payload_bytes - (largest - limit)
    if fits >= 0:
        raise ConfigError(
            f"TIMER_MAX_PAYLOAD_BYTES={s.max_payload_bytes} lets a DueTimeReached event reach {largest}"
            f" bytes, more than {what}: set it to at most {fits}"
        )
    if s.carried_names:
        raise ConfigError(
            f"TIMER_CARRY_HEADERS: events carrying {len(s.carried_names)} producer headers of up to"
            f" {MAX_CARRIED_VALUE_CHARS} characters can reach {largest - s.max_payload_bytes} bytes"
            f" without data, more than {what}: carry fewer"
        )
    # Ids, labels and trace context alone: only a bigger limit makes room for them.
    raise ConfigError(
        f"events can reach {largest - s.max_payload_bytes} bytes without data (ids, labels, trace"
        f" context), more than {what}: raise it"
    )


def event_batches(
    s: Settings, events: api.StreamConfig, fast_ingest: bool, was_fast: bool, cheaper: bool | None = None
) -> bool:
    """Fast-ingest (True) or atomic batches for events, from TIMER_EVENTS_FAST_INGEST, the server
    and the stream as it exists: "auto" takes fast ones on a replicated stream, or once measured
    cheaper (`cheaper`, probe.py)."""
    mode = s.events_fast_ingest
    allowed = _takes_fast(events, fast_ingest)
    fast = allowed and (mode == "on" or (mode == "auto" and (_replicated(events) or cheaper is True)))
    if fast != was_fast or (mode == "on" and not allowed):
        log.info(
            "event batches",
            extra={
                "action": "event_batches",
                "mode": "fast_ingest" if fast else "atomic",
                "stream": events.name,
                "allow_batched": bool(getattr(events, "allow_batched", False)),
            },
        )
    return fast


def probe_wanted(s: Settings, events: api.StreamConfig, fast_ingest: bool) -> bool:
    """Whether "auto" must measure: a single-replica events stream of ours that takes fast ones."""
    return (
        s.events_fast_ingest == "auto"
        and _takes_fast(events, fast_ingest)
        and not _replicated(events)
        and s.create_streams
    )


def _takes_fast(events: api.StreamConfig, fast_ingest: bool) -> bool:
    """The server (`fast_ingest`) and the stream as it exists both take fast-ingest batches."""
    return bool(getattr(events, "allow_batched", False)) and fast_ingest


def _replicated(events: api.StreamConfig) -> bool:
    return (events.num_replicas or 1) > 1


def command_filter(subjects: Subjects, stream_subjects: Sequence[str]) -> list[str] | None:
    """The shared consumer's filter: none while the stream binds command subjects only, else the
    command subjects. A filter costs (docs/BENCHMARKS.md, intake-tenants)."""
    commands = subjects.commands
    return None if set(stream_subjects) <= set(commands) else commands


def consumer_config(
    settings: Settings, subjects: Subjects, stream_subjects: Sequence[str]
) -> api.ConsumerConfig:
    """The shared command consumer, as the service creates it on a stream binding `stream_subjects`."""
    return api.ConsumerConfig(
        durable_name=settings.consumer,
        # Explicit acks, never AckAll: the consumer is shared with other replicas.
        ack_policy=api.AckPolicy.EXPLICIT,
        # A dead replica's commands go to another after this; a redelivery of one in hand is harmless.
        ack_wait=ACK_WAIT_S,
        max_ack_pending=50_000,
        max_deliver=-1,
        filter_subjects=command_filter(subjects, stream_subjects),
    )


async def command_stream_now(js: JetStreamContext, settings: Settings) -> str:
    """The stream that takes commands now: the configured one, or its successor after a cut-over."""
    try:
        info = await js.stream_info(settings.command_stream)
    except NotFoundError:
        return settings.command_stream
    return (info.config.metadata or {}).get(SUCCESSOR) or settings.command_stream


class CommandStreams:
    """The command stream intake reads, the old one it drains after a cut-over, and its purge."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.command_stream = settings.command_stream
        self.draining: str | None = None
        self.purging = False  # a limits command stream: acknowledged commands are ours to purge
        self._purged = 0  # the ack floor up to which this replica last purged
        self._told_work_queue = False

    async def resolve(
        self, js: JetStreamContext, found: dict[str, api.StreamConfig], messages: dict[str, int]
    ) -> str:
        """The stream intake reads: the configured one or the one migrate-streams moved its subjects
        to, the old one drained meanwhile. TransientError when the successor is missing."""
        s = self.settings
        configured = found[s.command_stream]
        successor = (configured.metadata or {}).get(SUCCESSOR)
        if successor is None:
            self.command_stream, self.draining = s.command_stream, None
        else:
            try:
                found[successor] = (await js.stream_info(successor)).config
            except NotFoundError:
                raise TransientError(
                    f"stream {successor}, which took over {s.command_stream}'s subjects, does not exist"
                    " (run timer-service migrate-streams again)"
                ) from None
            if self.command_stream != successor:
                log.info(
                    "command stream moved",
                    extra={"action": "command_stream_moved", "stream": successor, "from": s.command_stream},
                )
            self.command_stream = successor
            self.draining = s.command_stream if messages[s.command_stream] else None
        retention = found[self.command_stream].retention
        self.purging = retention == api.RetentionPolicy.LIMITS
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

    async def purge_acknowledged(self, nc: NATS, js: JetStreamContext) -> int:
        """Remove the commands below the shared consumer's ack floor; how many went. Nothing
        unacknowledged lies below it and floors only move forward, so replicas may purge at once.
        """
        try:
            info = await js.consumer_info(self.command_stream, self.settings.consumer)
        except NotFoundError:  # intake's failed fetch puts it back
            return 0
        floor = int(info.ack_floor.stream_seq if info.ack_floor else 0)
        if floor <= self._purged:
            return 0
        reply = await nc.request(
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


class CommandFeed:
    """The shared consumer's commands, through a Pull of ours per stream; after a cut-over each
    fetch looks first, briefly, at the old stream while it holds commands: they come first."""

    def __init__(self, nc: NATS, consumer: str, streams: CommandStreams) -> None:
        self._nc = nc
        self._consumer = consumer
        self._streams = streams
        self._pulls: dict[str, Pull] = {}

    async def _pull(self, stream: str) -> Pull:
        if stream not in self._pulls:
            pull = Pull(self._nc, stream, self._consumer)
            await pull.start()
            self._pulls[stream] = pull
        return self._pulls[stream]

    async def fetch(self, batch: int, timeout: float) -> list[Msg]:
        b = self._streams
        for gone in [name for name in self._pulls if name not in (b.command_stream, b.draining)]:
            await self._pulls.pop(gone).unsubscribe()  # fetched commands can still be acknowledged
        if b.draining is not None:
            try:
                if msgs := await (await self._pull(b.draining)).fetch(batch, timeout=DRAIN_FETCH_S):
                    return msgs
            except (TimeoutError, PullFailed, nats.errors.Error):  # none now; tend_commands sees it go
                pass
        try:
            return await (await self._pull(b.command_stream)).fetch(batch, timeout=timeout)
        except TimeoutError:  # nats.errors.TimeoutError is one too: nothing came, not a failure
            raise
        except (PullFailed, nats.errors.Error) as exc:  # the core knows no nats-py error (ports.FetchFailed)
            raise FetchFailed(f"{type(exc).__name__}: {exc}") from exc

    async def unsubscribe(self) -> None:
        for pull in self._pulls.values():
            await pull.unsubscribe()
        self._pulls.clear()


def _age(d: timedelta) -> str:
    return f"{d.total_seconds():g}s" if d else "unlimited"
