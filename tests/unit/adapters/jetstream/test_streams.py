"""The command feed (worker/adapters/jetstream/streams.py, CommandFeed): the core knows no nats-py error, so
what a fetch meets reaches intake as the port says (worker/core/ports.py, CommandBatches)."""

from __future__ import annotations

from typing import Any

import nats.errors
import pytest
from nats.aio.msg import Msg

from worker.adapters.jetstream.pull import PullFailed
from worker.adapters.jetstream.streams import CommandFeed, CommandStreams
from worker.core.ports import FetchFailed
from worker.settings import load_settings


class Conn:
    """The calls CommandFeed's pulls make of a nats-py connection: a request that cannot be sent
    raises `error`; one that can is answered with the status `answer`, if any."""

    def __init__(self, error: Exception | None = None, answer: str | None = None) -> None:
        self.error, self.answer = error, answer
        self.cb: Any = None
        self.is_reconnecting = False  # (one that cannot take a request raises `error`)

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def subscribe(self, subject: str, cb: Any) -> Conn:
        self.cb = cb
        return self

    async def unsubscribe(self) -> None:
        pass

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "") -> None:
        if self.error is not None:
            raise self.error
        if self.answer is not None:
            await self.cb(Msg(self, subject=reply, reply="", headers={"Status": self.answer}))  # type: ignore[arg-type]


def feed(conn: Conn) -> CommandFeed:
    settings = load_settings()
    return CommandFeed(conn, settings.consumer, CommandStreams(settings))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [nats.errors.ConnectionClosedError(), nats.errors.ConnectionReconnectingError()],
    ids=["closed", "reconnecting"],
)
async def test_a_nats_error_reaches_intake_as_fetch_failed_naming_it(error: Exception) -> None:
    with pytest.raises(FetchFailed) as caught:
        await feed(Conn(error)).fetch(10, 0.1)
    assert str(caught.value).startswith(f"{type(error).__name__}: "), caught.value
    assert caught.value.__cause__ is error


async def test_a_pull_the_server_refuses_reaches_intake_as_fetch_failed() -> None:
    """No responders: no consumer (deleted), or no leader for its stream now."""
    with pytest.raises(FetchFailed) as caught:
        await feed(Conn(answer="503")).fetch(10, 1.0)
    assert str(caught.value) == "PullFailed: 503"
    assert isinstance(caught.value.__cause__, PullFailed)


async def test_a_fetch_that_timed_out_stays_a_timeout() -> None:
    """Nothing came: not a failure, and not logged as one."""
    with pytest.raises(TimeoutError) as caught:
        await feed(Conn()).fetch(10, 0.1)
    assert not isinstance(caught.value, FetchFailed)
