"""The command feed (worker/adapters/streams.py, CommandFeed): the core knows no nats-py error, so
what a fetch meets reaches intake as the port says (worker/core/ports.py, CommandBatches)."""

from __future__ import annotations

from typing import Any

import nats.errors
import nats.js.errors
import pytest

from worker.adapters.streams import CommandFeed, CommandStreams
from worker.config import load_settings
from worker.core.ports import FetchFailed


class Subscription:
    def __init__(self, error: Exception) -> None:
        self.error = error

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        raise self.error


class Js:
    """The one call CommandFeed makes of a JetStream context to get a subscription."""

    def __init__(self, error: Exception) -> None:
        self.sub = Subscription(error)

    async def pull_subscribe_bind(self, consumer: str, stream: str) -> Subscription:
        return self.sub


def feed(error: Exception) -> CommandFeed:
    settings = load_settings()
    return CommandFeed(Js(error), settings.consumer, CommandStreams(settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [nats.js.errors.ServiceUnavailableError(), nats.errors.ConnectionReconnectingError()],
    ids=["no-leader", "reconnecting"],
)
async def test_a_nats_error_reaches_intake_as_fetch_failed_naming_it(error: Exception) -> None:
    with pytest.raises(FetchFailed) as caught:
        await feed(error).fetch(10, 0.1)
    assert str(caught.value).startswith(f"{type(error).__name__}: "), caught.value
    assert caught.value.__cause__ is error


async def test_a_fetch_that_timed_out_stays_a_timeout() -> None:
    """Nothing came: not a failure, and not logged as one."""
    with pytest.raises(TimeoutError) as caught:
        await feed(nats.errors.TimeoutError()).fetch(10, 0.1)
    assert not isinstance(caught.value, FetchFailed)
