"""TimerClient.get's answers and failures (worker/client/errors.py): each failure a TimerClientError
of its own kind, and still what `get` raised before, so existing `except` clauses keep working."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats.errors
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from worker.client import GetRefused, GetTimeout, NoReplica, TimerClient, TimerClientError


def client(answer: BaseException | dict[str, Any]) -> tuple[TimerClient, list[tuple[str, bytes]]]:
    """A client whose every request gets `answer`: raised when an error, else replied as JSON."""
    nc = NATS()
    asked: list[tuple[str, bytes]] = []

    async def request(subject: str, payload: bytes = b"", timeout: float = 0.5, **_: Any) -> Msg:
        asked.append((subject, payload))
        if isinstance(answer, BaseException):
            raise answer
        return Msg(nc, subject="_INBOX.x", data=json.dumps(answer).encode())

    nc.request = request  # type: ignore[method-assign]
    return TimerClient(nc, "svc"), asked


async def test_a_timer_is_returned_and_an_unknown_one_is_none() -> None:
    view = {"tenantId": "acme", "serviceCallId": "sc-1", "state": "Scheduled"}
    timers, asked = client(view)
    assert await timers.get("acme", "sc-1") == view
    assert asked == [("svc.acme.timer.get", b'{"serviceCallId": "sc-1"}')]
    timers, _ = client({"error": "not_found", "tenantId": "acme"})
    assert await timers.get("acme", "sc-1") is None


async def test_no_reply_in_time_is_a_get_timeout_and_still_a_timeout() -> None:
    timers, _ = client(nats.errors.TimeoutError())
    with pytest.raises(GetTimeout) as raised:
        await timers.get("acme", "sc-1", timeout=0.1)
    assert isinstance(raised.value, TimerClientError)
    # What callers caught before: nats-py's TimeoutError, the builtin one (asyncio.timeout's).
    assert isinstance(raised.value, nats.errors.TimeoutError)
    assert isinstance(raised.value, asyncio.TimeoutError) and isinstance(raised.value, nats.errors.Error)
    assert isinstance(raised.value.__cause__, nats.errors.TimeoutError)
    assert "timeout" in str(raised.value)


async def test_nobody_listening_is_no_replica_and_still_no_responders() -> None:
    timers, _ = client(nats.errors.NoRespondersError())
    with pytest.raises(NoReplica) as raised:
        await timers.get("acme", "sc-1")
    assert isinstance(raised.value, TimerClientError)
    assert isinstance(raised.value, nats.errors.NoRespondersError)
    assert "no responders" in str(raised.value)


@pytest.mark.parametrize(
    ("reply", "code", "detail"),
    [
        ({"error": "bad_request", "detail": "too long"}, "bad_request", "too long"),
        ({"error": "unavailable"}, "unavailable", ""),
    ],
)
async def test_an_error_reply_is_get_refused_with_its_code_and_still_a_runtime_error(
    reply: dict[str, Any], code: str, detail: str
) -> None:
    timers, _ = client(reply)
    with pytest.raises(GetRefused) as raised:
        await timers.get("acme", "sc-1")
    assert (raised.value.code, raised.value.detail) == (code, detail)
    assert isinstance(raised.value, TimerClientError) and isinstance(raised.value, RuntimeError)
    assert str(raised.value) == f"{code}: {detail}"  # the message get's RuntimeError carried


async def test_any_other_error_of_the_connection_is_left_as_it_is() -> None:
    """Only what the client names becomes its own: a closed connection stays nats-py's."""
    timers, _ = client(nats.errors.ConnectionClosedError())
    with pytest.raises(nats.errors.ConnectionClosedError) as raised:
        await timers.get("acme", "sc-1")
    assert not isinstance(raised.value, TimerClientError)
