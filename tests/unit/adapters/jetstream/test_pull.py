"""Our pull (worker/adapters/jetstream/pull.py) without a server: a fake connection records each
MSG.NEXT request, the test answers as a server would (deliveries, then a status on the request's
own reply subject), and each status ends the fetch the way ADR-13 says."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import nats.errors
import pytest
from nats.aio.msg import Msg

from tests.helpers import until
from worker.adapters.jetstream.pull import Pull, PullFailed


class Conn:
    """The calls Pull makes of a nats-py connection; each request it publishes is kept."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any], str]] = []
        self.acks: list[tuple[str, bytes]] = []
        self.cb: Any = None
        self.unsubscribed = False
        self.refuse: Exception | None = None
        self.is_reconnecting = False

    def new_inbox(self) -> str:
        return "_INBOX.test"

    async def subscribe(self, subject: str, cb: Any) -> Conn:
        assert subject == "_INBOX.test.*"
        self.cb = cb
        return self

    async def unsubscribe(self) -> None:
        self.unsubscribed = True

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "", headers: Any = None) -> None:
        if subject.startswith("$JS.ACK."):
            self.acks.append((subject, payload))
            return
        if self.refuse is not None:
            raise self.refuse
        self.requests.append((subject, json.loads(payload), reply))

    async def deliver(self, *seqs: int) -> None:
        for seq in seqs:
            reply = f"$JS.ACK.CMD.worker.1.{seq}.{seq}.1700000000000000000.0"
            await self.cb(Msg(self, subject="t.acme.timer.schedule", reply=reply, data=b"{}"))  # type: ignore[arg-type]

    async def status(self, code: str, description: str, request: int = -1) -> None:
        reply = self.requests[request][2]
        headers = {"Status": code, "Description": description}
        await self.cb(Msg(self, subject=reply, reply="", data=b"", headers=headers))  # type: ignore[arg-type]


async def started() -> tuple[Conn, Pull]:
    conn = Conn()
    pull = Pull(conn, "CMD", "worker")  # type: ignore[arg-type]
    await pull.start()
    return conn, pull


def seqs(msgs: list[Msg]) -> list[int]:
    return [m.metadata.sequence.stream for m in msgs]


async def answered(conn: Conn, fetch: asyncio.Task[list[Msg]], n: int) -> None:
    await until(lambda: len(conn.requests) >= n, timeout=5, what=f"request {n}")
    assert not fetch.done()


async def test_one_request_asks_no_wait_with_expires_and_returns_what_it_brought() -> None:
    conn, pull = await started()
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await answered(conn, fetch, 1)
    subject, body, _ = conn.requests[0]
    assert subject == "$JS.API.CONSUMER.MSG.NEXT.CMD.worker"
    assert body["batch"] == 10 and body["no_wait"] is True
    assert 4.9e9 < body["expires"] < 5e9  # a little shorter than the fetch waits
    await conn.deliver(1, 2, 3)
    await asyncio.sleep(0)
    assert not fetch.done()  # a no_wait request ends with a status: the batch waits for it
    await conn.status("408", "Request Timeout")
    assert seqs(await fetch) == [1, 2, 3]
    assert len(conn.requests) == 1


async def test_a_full_batch_returns_without_waiting_for_a_status() -> None:
    conn, pull = await started()
    fetch = asyncio.create_task(pull.fetch(2, 5.0))
    await answered(conn, fetch, 1)
    await conn.deliver(1, 2)
    assert seqs(await fetch) == [1, 2]


async def test_a_late_delivery_of_an_earlier_request_is_handed_out_by_the_next_fetch() -> None:
    conn, pull = await started()
    with pytest.raises(TimeoutError):
        await pull.fetch(10, 0.05)  # its request is still out when the fetch gives up
    await conn.deliver(7)  # ... and brings a message afterwards
    assert seqs(await pull.fetch(10, 5.0)) == [7]
    assert len(conn.requests) == 1  # what was buffered came without asking again


async def test_a_batch_larger_than_asked_is_handed_out_in_order_over_fetches() -> None:
    conn, pull = await started()
    fetch = asyncio.create_task(pull.fetch(2, 5.0))
    await answered(conn, fetch, 1)
    await conn.deliver(1, 2, 3)
    assert seqs(await fetch) == [1, 2]
    assert seqs(await pull.fetch(2, 5.0)) == [3]


@pytest.mark.parametrize(
    ("code", "description"),
    [("404", "No Messages"), ("408", "Request Timeout"), ("409", "Leadership Change")],
)
async def test_a_status_that_ends_a_request_empty_handed_asks_again_waiting_its_turn(
    code: str, description: str
) -> None:
    conn, pull = await started()
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await answered(conn, fetch, 1)
    await conn.status(code, description)
    await answered(conn, fetch, 2)
    assert "no_wait" not in conn.requests[1][1]  # not asking again and again (408 Requests Pending)
    await conn.deliver(4)  # a lingering request trickles: what came is handed out at once
    assert seqs(await fetch) == [4]
    # Its request is still out: the next fetch waits on it rather than asking a third time.
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await conn.deliver(5)
    assert seqs(await fetch) == [5]
    assert len(conn.requests) == 2


async def test_a_heartbeat_and_an_earlier_requests_status_change_nothing() -> None:
    conn, pull = await started()
    with pytest.raises(TimeoutError):
        await pull.fetch(10, 0.05)
    await conn.status("408", "Request Timeout")  # ends the first request
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await answered(conn, fetch, 2)
    await conn.status("409", "Consumer Deleted", request=0)  # the first's: already over
    await conn.status("100", "Idle Heartbeat")
    await conn.deliver(1)
    await conn.status("408", "Request Timeout")
    assert seqs(await fetch) == [1]


@pytest.mark.parametrize(
    ("code", "description"),
    [
        ("503", ""),
        ("409", "Consumer Deleted"),
        ("409", "Exceeded MaxRequestBatch of 100"),
        ("400", "Bad Request"),
    ],
)
async def test_a_refused_pull_fails_the_fetch_naming_the_status(code: str, description: str) -> None:
    conn, pull = await started()
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await answered(conn, fetch, 1)
    await conn.status(code, description)
    with pytest.raises(PullFailed) as caught:
        await fetch
    assert str(caught.value) == f"{code} {description}".strip()
    # Said once: the next fetch asks again.
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await answered(conn, fetch, 2)
    fetch.cancel()


async def test_nothing_at_all_is_a_timeout_after_the_wait() -> None:
    conn, pull = await started()
    loop = asyncio.get_running_loop()
    started_at = loop.time()
    with pytest.raises(TimeoutError):
        await pull.fetch(10, 0.2)
    assert loop.time() - started_at >= 0.2
    assert len(conn.requests) == 1


async def test_a_request_that_cannot_be_sent_raises_and_is_not_waited_on() -> None:
    conn, pull = await started()
    conn.refuse = nats.errors.ConnectionReconnectingError()
    with pytest.raises(nats.errors.ConnectionReconnectingError):
        await pull.fetch(10, 5.0)
    conn.refuse = None
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await answered(conn, fetch, 1)  # asked again at once, not after a lost request's expiry
    fetch.cancel()


async def test_unsubscribe_offers_back_what_was_never_handed_out() -> None:
    conn, pull = await started()
    fetch = asyncio.create_task(pull.fetch(1, 5.0))
    await answered(conn, fetch, 1)
    await conn.deliver(1, 2, 3)
    assert seqs(await fetch) == [1]
    await pull.unsubscribe()
    assert conn.unsubscribed
    assert [(s.split(".")[5], p) for s, p in conn.acks] == [("2", b"-NAK"), ("3", b"-NAK")]
    assert pull.buffered == 0


async def test_nothing_is_asked_while_reconnecting() -> None:
    # nats-py would keep the request until it reconnected, and the server count its expiry
    # from then, long after this took it for lost and asked again.
    conn, pull = await started()
    conn.is_reconnecting = True
    with pytest.raises(TimeoutError):
        await pull.fetch(10, 0.1)
    assert conn.requests == []
    conn.is_reconnecting = False
    fetch = asyncio.create_task(pull.fetch(10, 5.0))
    await answered(conn, fetch, 1)
    fetch.cancel()
