"""`timer-service migrate-streams`: move a work-queue command stream's traffic to a limits stream.

Retention cannot change in place, and two streams cannot take the same subjects, so the cut-over
is three JetStream requests, each safe to repeat (the command is idempotent: run it again after
any failure and it picks up where it stopped):

1. The old stream gives up its subjects and names its successor in its metadata, in one update.
   From then on it takes no new command; what it holds is drained by the replicas, which follow
   the name (Broker.tend_commands) and read both streams until the old one is empty.
2. The successor is created with limits retention and the command subjects, its first sequence
   one past the old stream's last: stream sequences keep ordering a timer's commands across the
   two streams (Store.apply), a deferred command in the old stream still holds back the newer
   ones in the new.
3. The shared consumer is created on it (the replicas would create it too, identically).

Between 1 and 2 (one request) no stream takes the command subjects: a publish then fails with
"no responders" and the producer retries it, as it retries any failed publish; its Nats-Msg-Id
drops the copy should both attempts land.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable

from nats.js import api
from nats.js.errors import NotFoundError

from worker.adapters.jetstream.broker import Broker
from worker.adapters.jetstream.streams import SUCCESSOR, consumer_config
from worker.config import Settings
from worker.errors import ConfigError

PROGRESS_EVERY_S = 5.0


async def migrate_streams(
    settings: Settings, to: str | None = None, wait: float | None = None, say: Callable[[str], None] = print
) -> bool:
    """Cut the command stream over to a limits stream (`to`, default `<TIMER_COMMAND_STREAM>_V2`);
    then wait up to `wait` seconds (None: for good, 0: not at all) for the old one to drain.
    True when nothing is left to do: drained, or nothing to migrate."""
    broker = Broker(settings)
    await broker.connect()
    try:
        return await _migrate(broker, to, wait, say)
    finally:
        await broker.close()


async def _migrate(broker: Broker, to: str | None, wait: float | None, say: Callable[[str], None]) -> bool:
    s, js = broker.settings, broker.js
    old = s.command_stream
    try:
        info = await js.stream_info(old)
    except NotFoundError:
        raise ConfigError(f"stream {old} does not exist: nothing to migrate") from None
    successor = (info.config.metadata or {}).get(SUCCESSOR)
    if successor is None:
        if info.config.retention != api.RetentionPolicy.WORK_QUEUE:
            say(f"stream {old} has {info.config.retention} retention already: nothing to migrate")
            return True
        successor = to or f"{old}_V2"
        if successor == old:
            raise ConfigError(f"--to: the new stream needs a name other than {old}")
        retired = dataclasses.replace(
            info.config, subjects=[old], metadata={**(info.config.metadata or {}), SUCCESSOR: successor}
        )
        info = await js.update_stream(retired)
        say(f"stream {old} takes no new commands; its successor is {successor}")
    elif to is not None and to != successor:
        raise ConfigError(f"--to: stream {old} was already cut over to {successor}")
    try:
        await js.stream_info(successor)
    except NotFoundError:
        first = int(info.state.last_seq) + 1
        ours = broker.stream_configs()[0]  # the batch flags this service gives a command stream
        config = dataclasses.replace(
            info.config,
            name=successor,
            subjects=broker.subjects.commands,
            retention=api.RetentionPolicy.LIMITS,
            metadata=None,
            first_seq=first,
            allow_atomic=ours.allow_atomic,
        )
        if getattr(ours, "allow_batched", False):  # TimerClient.schedule_many's fast batches
            config.allow_batched = True
        await js.add_stream(config)
        say(f"stream {successor} created (limits retention, first sequence {first}); it takes the commands")
    try:
        await js.consumer_info(successor, s.consumer)
    except NotFoundError:
        await js.add_consumer(successor, consumer_config(s, broker.subjects, broker.subjects.commands))
    return await _drained(broker, old, successor, wait, say)


async def _drained(
    broker: Broker, old: str, new: str, wait: float | None, say: Callable[[str], None]
) -> bool:
    deadline = None if wait is None else time.monotonic() + wait
    told = float("-inf")
    while True:
        try:
            left = int((await broker.js.stream_info(old)).state.messages)
        except NotFoundError:
            left = 0
        if not left:
            say(
                f"stream {old} is empty: every command is read from {new}. Set TIMER_COMMAND_STREAM={new}"
                f" when convenient; {old} may be deleted after that (until then it tells replicas where"
                " the commands went)"
            )
            return True
        if deadline is not None and time.monotonic() >= deadline:
            say(f"stream {old} still holds {left} commands; the replicas drain it (run again to wait)")
            return False
        if time.monotonic() - told >= PROGRESS_EVERY_S:
            told = time.monotonic()
            say(f"stream {old}: {left} commands left for the replicas to apply")
        await asyncio.sleep(0.5)  # polling the stream's state: there is nothing to wait on
