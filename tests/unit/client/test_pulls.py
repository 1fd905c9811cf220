"""A reader's pull requests (worker/client/pulls.py) against a model of the server: what it asked
for is counted exactly, and it never holds more than one batch, whatever the server does."""

from __future__ import annotations

import asyncio
import json

from hypothesis import given
from hypothesis import strategies as st

from worker.client.pulls import PULL_BATCH, Pulls


class _Server:
    """The requests waiting on the server (what each still wants) and the events delivered to
    the reader and not given out yet: the connection a Pulls publishes on."""

    def __init__(self) -> None:
        self.requests: list[int] = []
        self.received = 0

    async def publish(self, subject: str, payload: bytes, reply: str) -> None:
        assert subject == "$JS.API.CONSUMER.MSG.NEXT.S.d" and reply == "_INBOX.x"
        request = json.loads(payload)
        assert 0 < request["batch"] <= PULL_BATCH and request["idle_heartbeat"] * 2 <= request["expires"]
        self.requests.append(request["batch"])


STEPS = st.lists(
    st.sampled_from(["top_up", "deliver", "give", "expire", "refuse", "cut", "silence"]), max_size=400
)


@given(STEPS, st.sampled_from([2, 7, PULL_BATCH]))
def test_a_reader_asks_for_what_it_can_take_and_never_holds_more_than_a_batch(
    steps: list[str], batch: int
) -> None:
    asyncio.run(_run(steps, batch))


async def _run(steps: list[str], batch: int) -> None:
    server, pulls = _Server(), Pulls("S", "d", "_INBOX.x", batch)
    refused = False
    for step in steps:
        if step == "top_up":
            before = len(server.requests)
            await pulls.top_up(server)
            asked = len(server.requests) > before
            assert not (asked and refused), "asked again before a silence after a refusal"
        elif step == "deliver" and server.requests:  # one event to the oldest request
            server.requests[0] -= 1
            server.received += 1
            if server.requests[0] == 0:
                server.requests.pop(0)
        elif step == "give" and server.received:
            server.received -= 1
            pulls.given()
        elif step == "expire" and server.requests:  # 408, with what it did not deliver
            pulls.ended(b"408", server.requests.pop(0))
        elif step == "refuse":  # no responders: no request was taken
            refused = True
            pulls.ended(b"503", None)
        elif step == "cut" and server.requests:  # a leader change: ended without a count
            server.requests.pop(0)
            refused = True
            pulls.ended(b"409", None)
        elif step == "silence" and not server.requests:  # no heartbeat: none is waiting
            refused = False
            pulls.anew(server.received)
        pulls.ended(b"100", None)  # a heartbeat changes nothing
        if not refused:
            assert pulls.wanted == server.received + sum(server.requests)
        assert server.received + sum(server.requests) <= batch


def test_the_first_request_asks_for_a_batch_and_the_next_once_half_is_given_out() -> None:
    async def run() -> list[int]:
        server, pulls = _Server(), Pulls("S", "d", "_INBOX.x", 8)
        await pulls.top_up(server)
        for _ in range(8):
            server.received += 1
            server.requests[0] -= 1
        server.requests.pop(0)
        for _ in range(4):
            await pulls.top_up(server)  # 8, 7, 6, 5 asked for and not given: nothing asked
            server.received -= 1
            pulls.given()
        await pulls.top_up(server)  # 4 left: 4 more
        return server.requests

    assert asyncio.run(run()) == [4]


def test_a_consumer_that_caps_a_requests_batch_is_asked_within_the_cap_after_the_next_silence() -> None:
    async def run() -> list[int]:
        server, pulls = _Server(), Pulls("S", "d", "_INBOX.x")
        await pulls.top_up(server)
        server.requests.pop()  # refused whole, nothing delivered
        pulls.ended(b"409", None, "Exceeded MaxRequestBatch of 10")
        await pulls.top_up(server)  # not at once: it would loop on a refusal
        pulls.anew(0)
        await pulls.top_up(server)
        return server.requests

    assert asyncio.run(run()) == [10]
