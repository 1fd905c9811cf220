"""The shared command consumer's filter (streams.command_filter): none while the command stream binds
command subjects only, so that nats-server delivers a backlog over thousands of tenants as fast as
one over ten; the command filters again, in place, as soon as the stream binds anything else."""

from __future__ import annotations

import statistics
import time

from tests.helpers import until
from worker.adapters.jetstream.broker import Broker
from worker.adapters.jetstream.streams import consumer_config
from worker.config import Settings

# Commands per round: enough that the server's per-message cost, not a round trip, sets the time.
BACKLOG = 8_000
# Pairs of rounds: single rounds spread 2.5 x on a busy machine; the median of five does not.
PAIRS = 5


async def delivered_per_s(broker: Broker, settings: Settings, tenants: int) -> float:
    """Publish BACKLOG schedules spread over `tenants` tenant subjects, then time the replica's own
    feed (streams.CommandFeed) delivering all of them; the stream is emptied afterwards."""
    js = broker.js
    stream = settings.command_stream
    start = (await js.stream_info(stream)).state.last_seq
    for i in range(BACKLOG):
        await broker.nc.publish(f"{settings.subject_prefix}.t{i % tenants}.timer.schedule", b"{}")
    await broker.nc.flush()

    async def all_stored() -> bool:
        return (await js.stream_info(stream)).state.last_seq >= start + BACKLOG

    await until(all_stored, what="backlog stored")
    feed = await broker.command_subscription()
    got = 0
    began = time.monotonic()
    while got < BACKLOG:
        got += len(await feed.fetch(1000, timeout=5))
    elapsed = time.monotonic() - began
    await feed.unsubscribe()
    await js.purge_stream(stream)
    return BACKLOG / elapsed


async def test_a_backlog_over_thousands_of_tenants_is_delivered_about_as_fast_as_over_ten(
    settings: Settings,
) -> None:
    """With the four command filters nats-server delivered 0.04 x as fast over 5,000 tenants as
    over 10 (docs/BENCHMARKS.md, intake-tenants). The machine's load varies, the server's cost per
    subject does not: each pair of rounds is run back to back (in alternating order, so neither
    always has the machine first) and gives a ratio, and the median of PAIRS ratios counts."""
    broker = Broker(settings)
    await broker.connect()
    try:
        await broker.ensure_streams()
        rates: dict[int, list[float]] = {10: [], 5_000: []}
        for pair in range(PAIRS):
            for tenants in (10, 5_000) if pair % 2 == 0 else (5_000, 10):
                rates[tenants].append(await delivered_per_s(broker, settings, tenants))
        ratio = statistics.median(many / few for few, many in zip(rates[10], rates[5_000], strict=True))
        assert ratio >= 0.5, (
            f"median ratio {ratio:.2f}: commands/s over 10 tenants {rates[10]}, over 5,000 {rates[5_000]}"
        )
    finally:
        await broker.close()


async def test_a_filtered_consumer_loses_its_filter_in_place_and_gets_it_back_for_a_foreign_subject(
    settings: Settings,
) -> None:
    """A consumer an older release made with the four command filters keeps its place and its
    undelivered commands when start-up drops them; a subject bound to the stream later brings the
    filter back at the next upkeep round, so a message on it is never taken for a command."""
    broker = Broker(settings)
    await broker.connect()
    js = broker.js
    prefix, stream = settings.subject_prefix, settings.command_stream
    try:
        for config in broker.stream_configs():
            await js.add_stream(config)
        old = consumer_config(settings, broker.subjects, [f"{prefix}.*.timer.other"])
        assert old.filter_subjects == broker.subjects.commands  # as the releases before this one made it
        await js.add_consumer(stream, old)
        for i in range(3):
            await js.publish(f"{prefix}.acme.timer.schedule", f"{i}".encode())
        feed = await broker.command_subscription()
        [first] = await feed.fetch(1, timeout=5)
        await first.ack()

        await broker.ensure_streams()
        info = await js.consumer_info(stream, settings.consumer)
        assert not info.config.filter_subjects and not info.config.filter_subject
        assert (info.delivered.stream_seq, info.num_pending) == (1, 2)

        config = (await js.stream_info(stream)).config
        config.subjects = [*(config.subjects or []), f"{prefix}.*.timer.later"]
        await js.update_stream(config)
        await broker.tend_once()
        info = await js.consumer_info(stream, settings.consumer)
        assert sorted(info.config.filter_subjects or []) == sorted(broker.subjects.commands)
        await js.publish(f"{prefix}.acme.timer.later", b"not a command")
        await js.publish(f"{prefix}.acme.timer.cancel", b"3")
        taken = []
        while len(taken) < 3:
            taken += [m.subject for m in await feed.fetch(10, timeout=5)]
        assert taken == [f"{prefix}.acme.timer.schedule"] * 2 + [f"{prefix}.acme.timer.cancel"]
        assert (await js.consumer_info(stream, settings.consumer)).num_pending == 0
        await feed.unsubscribe()
    finally:
        await broker.close()


def test_the_consumer_is_made_without_a_filter_on_a_stream_of_commands_only(settings: Settings) -> None:
    subjects = Broker(settings).subjects
    for bound in (subjects.commands, subjects.commands[:2]):  # the stream before pause and resume too
        assert consumer_config(settings, subjects, bound).filter_subjects is None
