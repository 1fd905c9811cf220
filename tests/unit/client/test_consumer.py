"""The consumer's own reading of what nats-py would read for it: take_raw's routing by
subscription, the envelope's decoding and the header block's parsing (held to nats-py's)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import nats.errors
import nats.js.errors
import pytest
from hypothesis import given
from hypothesis import strategies as st
from nats.aio.client import Client as NATS
from nats.js import api

from worker.client.acks import Acks
from worker.client.consumer import _decode, _parse_headers, _still_there
from worker.client.wire import encode, take_raw


async def test_take_raw_routes_its_subscription_only_until_released() -> None:
    nc = NATS()
    through_nats_py: list[tuple[Any, ...]] = []

    async def process_msg(*args: Any) -> None:  # stands for nats-py's own, which it wraps
        through_nats_py.append(args)

    nc._process_msg = process_msg  # type: ignore[method-assign]
    taken: list[tuple[Any, ...]] = []
    release = take_raw(nc, 7, lambda *args: taken.append(args))
    assert release is not None
    await nc._process_msg(7, b"a.b", b"r", b"data", None)
    await nc._process_msg(8, b"c.d", b"", b"other", b"NATS/1.0\r\n\r\n")
    assert taken == [(b"a.b", b"r", b"data", None)]
    assert through_nats_py == [(8, b"c.d", b"", b"other", b"NATS/1.0\r\n\r\n")]
    release()
    await nc._process_msg(7, b"a.b", b"r", b"again", None)
    assert len(taken) == 1 and through_nats_py[-1][3] == b"again"


def test_take_raw_declines_a_client_whose_parser_it_does_not_know() -> None:
    class Other:
        def _process_msg(self, *args: Any) -> None:  # not a coroutine: not nats-py 2's
            pass

    assert take_raw(Other(), 1, lambda *args: None) is None  # type: ignore[arg-type]


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
        max_leaves=8,
    )
)
def test_an_envelope_decodes_as_json_loads_does(inner: Any) -> None:
    value = {"id": "e", "payload": inner}
    for text in (json.dumps(value), json.dumps(value, indent=1), f"  {json.dumps(value)}\n"):
        assert _decode(text.encode()) == json.loads(text)


@pytest.mark.parametrize("text", ["", "{", '{"a": 1} x', "[1]", "nul"])
def test_what_is_not_one_json_object_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        _decode(text.encode())


header_keys = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,20}", fullmatch=True)
header_values = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)


@given(st.dictionaries(header_keys, header_values, min_size=1, max_size=6))
def test_a_header_block_parses_as_nats_py_parses_it(headers: dict[str, str]) -> None:
    wire, _ = encode([("s", b"x", "", headers)])
    block = wire[wire.index(b"\r\n") + 2 :]  # after the HPUB line: the header block, then the payload
    block = block[: block.index(b"\r\n\r\n") + 4]
    assert _parse_headers(block) == NATS._parse_header_lines(block[len(b"NATS/1.0\r\n") :])


class _Silent:
    """A JetStream context as a reader finds it after a silence: its connection, its consumer."""

    def __init__(
        self,
        *,
        closed: bool = False,
        connected: bool = True,
        error: Exception | None = None,
        deliver: str | None = None,
    ) -> None:
        self._nc = self
        self.is_closed, self.is_connected, self.error, self.deliver = closed, connected, error, deliver
        self.looked = 0

    async def consumer_info(self, stream: str, durable: str) -> api.ConsumerInfo:
        self.looked += 1
        if self.error is not None:
            raise self.error
        config = api.ConsumerConfig(deliver_subject=self.deliver)
        return api.ConsumerInfo(stream_name=stream, name=durable, config=config, created=datetime.now(UTC))


@pytest.mark.parametrize(
    ("js", "raised"),
    [
        (_Silent(closed=True, connected=False), nats.errors.ConnectionClosedError),
        (
            _Silent(error=nats.js.errors.NotFoundError(code=404, description="consumer not found")),
            nats.js.errors.NotFoundError,
        ),
        (_Silent(error=nats.errors.ConnectionClosedError()), nats.errors.ConnectionClosedError),
        (_Silent(deliver="d.another"), nats.js.errors.Error),  # made again, as a push consumer
    ],
)
async def test_after_a_silence_a_reader_ends_when_its_connection_or_its_consumer_is_gone(
    js: _Silent, raised: type[Exception]
) -> None:
    with pytest.raises(raised):
        await _still_there(js, "S", "d")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "js",
    [
        _Silent(),
        _Silent(connected=False),  # reconnecting: heartbeats come again after
        _Silent(error=nats.js.errors.ServiceUnavailableError(code=503)),  # a restarting server
        _Silent(error=nats.errors.TimeoutError()),
        _Silent(error=nats.errors.NoRespondersError()),
    ],
)
async def test_after_a_silence_a_reader_reads_on_when_the_server_is_only_slow_or_away(js: _Silent) -> None:
    await _still_there(js, "S", "d")  # type: ignore[arg-type]
    assert js.looked == (1 if js.is_connected else 0)


@pytest.mark.parametrize(
    ("head", "tail"),
    [("$JS.ACK.TIMER_EVENTS.billing", ""), ("$JS.ACK.hub.ACCHASH.TIMER_EVENTS.billing", ".rand0m")],
    ids=["without a domain", "with a domain and account hash (ADR-15)"],
)
def test_a_reader_keeps_only_the_last_delivery_of_an_event_that_came_again(head: str, tail: str) -> None:
    def reply(delivered: int, seq: int, dseq: int) -> bytes:
        return f"{head}.{delivered}.{seq}.{dseq}.1700000000000000000.0{tail}".encode()

    acks = Acks()
    first, other, again, third = reply(1, 7, 1), reply(1, 8, 2), reply(2, 7, 3), reply(3, 7, 4)
    for r in (first, other, third, again, b"not.an.ack.subject"):
        acks.open[r] = None
    acks.forget_superseded()
    assert list(acks.open) == [other, third, b"not.an.ack.subject"]
    assert acks.prune_at >= 2 * len(acks.open)
