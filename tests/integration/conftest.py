"""Fixtures shared by the integration tests that talk to the streams and the client directly, and by
those that cut the network to Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit

import nats
import pytest

from tests.chaos.proxy import Proxy
from worker.adapters.jetstream.broker import Broker
from worker.client import TimerClient
from worker.config import Settings


@pytest.fixture
async def streams(settings: Settings) -> AsyncIterator[Broker]:
    """A connected broker whose command and event streams exist. Its own events go in atomic
    batches: "off", not "auto", whose measure of the server (jetstream/test_probe.py) would tell the
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


@pytest.fixture
def proxy(db_url: str) -> Iterator[Proxy]:
    """Between the code under test and Postgres: the test cuts, refuses or stalls the network there."""
    target = urlsplit(db_url)
    with Proxy(target.hostname or "127.0.0.1", target.port or 5432) as p:
        yield p
