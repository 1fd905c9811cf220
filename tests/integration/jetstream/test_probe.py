"""TIMER_EVENTS_FAST_INGEST=auto on a single-replica events stream: a replica measures the
server's batches (worker/adapters/jetstream/probe.py), takes fast-ingest ones where they are the cheaper,
and says so to producers in the command stream's metadata (TimerClient, fast_ingest="auto")."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import nats
import pytest

from tests.integration.client.test_producer import command_headers, timers
from worker.adapters.jetstream.broker import Broker
from worker.adapters.jetstream.probe import MEASURED_AT, probe_stream
from worker.client import TimerClient
from worker.config import Settings
from worker.contract import FAST_BATCHES
from worker.devkit.embedded import EmbeddedNats


@pytest.fixture
def quick_nats(tmp_path: Path) -> Iterator[str]:
    """A server of this test's own without `sync_interval: always`: no fsync per write, so fast
    batches cost a third of atomic ones (docs/BENCHMARKS.md), whatever the disk."""
    with EmbeddedNats(tmp_path / "nats") as server:
        yield server.url


@pytest.fixture
async def measured(settings: Settings, quick_nats: str) -> AsyncIterator[Broker]:
    """A broker with "auto" on that server, once its measure is done."""
    b = Broker(settings.model_copy(update={"nats_url": quick_nats}))
    await b.connect()
    await b.ensure_streams()
    assert not b.publisher.fast, "atomic batches until measured, as before"
    assert b._probe is not None
    await b.batches_measured()
    yield b
    await b.close()


async def metadata(b: Broker) -> dict[str, str]:
    """The probe stream's: what the service says to producers."""
    return (await b.js.stream_info(f"{b.settings.event_stream}_PROBE")).config.metadata or {}


async def test_auto_takes_fast_batches_where_they_measure_the_cheaper(measured: Broker) -> None:
    assert measured.publisher.fast
    assert (await metadata(measured))[FAST_BATCHES] == "on"
    # Ensured again (a missing stream, a cut-over), nothing is measured twice nor undone.
    await measured.ensure_streams()
    assert measured.publisher.fast


async def test_a_producer_with_auto_follows_the_services_measure(measured: Broker) -> None:
    s = measured.settings
    nc = await nats.connect(s.nats_url)
    async with TimerClient(nc, s.subject_prefix, owns_connection=True) as client:
        sent = await client.schedule_many(timers(200))
        assert [x.outcome for x in sent] == ["accepted"] * 200
        assert client._fast is True
    _, headers, _ = await command_headers(measured, s)
    assert "Nats-Batch-Id" not in headers, "sent in fast batches"


async def test_a_producer_with_auto_keeps_atomic_batches_where_they_measured_the_cheaper(
    measured: Broker,
) -> None:
    s = measured.settings
    config = (await measured.js.stream_info(f"{s.event_stream}_PROBE")).config
    config.metadata = {**(config.metadata or {}), FAST_BATCHES: "off"}  # as under sync_interval: always
    await measured.js.update_stream(config)
    nc = await nats.connect(s.nats_url)
    async with TimerClient(nc, s.subject_prefix, owns_connection=True) as client:
        assert [x.outcome for x in await client.schedule_many(timers(200))] == ["accepted"] * 200
        assert client._fast is False
    _, headers, _ = await command_headers(measured, s)
    assert "Nats-Batch-Id" in headers


async def test_a_measure_that_cannot_be_made_leaves_atomic_batches_and_says_why(
    settings: Settings, quick_nats: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = settings.model_copy(update={"nats_url": quick_nats})
    b = Broker(s)
    await b.connect()
    try:
        # The probe's stream made by hand without fast batches: measured there, a refusal would
        # turn them off for the events too.
        events = b.stream_configs()[1]
        probe = probe_stream(s, b.subjects, events)
        probe.allow_batched = False
        await b.js.add_stream(probe)
        with caplog.at_level(logging.WARNING, logger="worker.adapters.jetstream"):
            await b.ensure_streams()
            assert b._probe is not None
            await b.batches_measured()
        assert not b.publisher.fast
        assert FAST_BATCHES not in await metadata(b)
        (warning,) = [r for r in caplog.records if getattr(r, "action", "") == "batches_not_measured"]
        assert "takes not both atomic and fast-ingest batches" in warning.error
    finally:
        await b.close()


@pytest.mark.parametrize(
    "update",
    [{"events_fast_ingest": "on"}, {"events_fast_ingest": "off"}, {"create_streams": False}],
    ids=["on", "off", "streams-not-ours"],
)
async def test_nothing_is_measured_where_nothing_is_to_choose(
    settings: Settings, quick_nats: str, update: dict[str, object]
) -> None:
    made = Broker(settings.model_copy(update={"nats_url": quick_nats}))
    await made.connect()
    for config in made.stream_configs():
        await made.js.add_stream(config)
    await made.close()
    b = Broker(settings.model_copy(update={"nats_url": quick_nats, **update}))
    await b.connect()
    try:
        await b.ensure_streams()
        assert b._probe is None
        assert b.publisher.fast is (update == {"events_fast_ingest": "on"})
    finally:
        await b.close()


@pytest.mark.parametrize("age_s", [60, 2 * 86400], ids=["recent", "a-day-old"])
async def test_a_recent_measure_is_taken_as_recorded_an_old_one_is_made_again(
    settings: Settings, quick_nats: str, age_s: int
) -> None:
    # Replicas started into a backlog need not measure under its load: what one recorded on the
    # probe stream in the last day stands ("off" here, which a measure on this server would not say).
    s = settings.model_copy(update={"nats_url": quick_nats})
    b = Broker(s)
    await b.connect()
    try:
        probe = probe_stream(s, b.subjects, b.stream_configs()[1])
        probe.metadata = {FAST_BATCHES: "off", MEASURED_AT: str(round(time.time() - age_s))}
        await b.js.add_stream(probe)
        await b.ensure_streams()
        await b.batches_measured()
        measured = (await b.js.stream_info(probe.name or "")).state.messages > 0
        assert (b.publisher.fast, measured) == ((False, False) if age_s < 86400 else (True, True))
        assert (await metadata(b))[FAST_BATCHES] == ("off" if age_s < 86400 else "on")
    finally:
        await b.close()
