"""Fixtures shared by the integration tests that talk to the streams and the client directly."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest

from worker.adapters.broker import Broker
from worker.client import TimerClient
from worker.config import Settings


@pytest.fixture
async def streams(settings: Settings) -> AsyncIterator[Broker]:
    """A connected broker whose command and event streams exist. Its own events go in atomic
    batches: "off", not "auto", whose measure of the server (test_batch_probe.py) would tell the
    producers of these tests to take fast batches while they run."""
    b = Broker(settings.model_copy(update={"events_fast_ingest": "off"}))
    await b.connect()
    await b.ensure_streams()
    yield b
    await b.close()


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[TimerClient]:
    """A client with its own connection, closed with it."""
    nc = await nats.connect(settings.nats_url)
    async with TimerClient(nc, settings.subject_prefix, owns_connection=True) as c:
        yield c
