"""The fault proxy against a real TCP server: it forwards, delays, drops, refuses and cuts as told."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from tests.chaos.proxy import Proxy
from tests.helpers import until

Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
DEADLINE_S = 5.0


class Upper:
    """The target: answers every chunk with it uppercased and keeps what each connection sent.
    b"two-part" is answered in two separate writes, the second holding b"DONE"."""

    def __init__(self) -> None:
        self.received: list[bytearray] = []
        self.closed = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got = bytearray()
        self.received.append(got)
        try:
            while data := await reader.read(65536):
                got += data
                if b"two-part" in data:
                    writer.write(b"PART-ONE\n")
                    await writer.drain()
                    await asyncio.sleep(0.02)  # not a wait for anything: it makes the parts two chunks
                    writer.write(b"DONE\n")
                else:
                    writer.write(data.upper())
                await writer.drain()
        except OSError:
            pass
        finally:
            self.closed += 1
            writer.close()

    def saw(self, request: bytes) -> int:
        """On how many connections the server received `request`."""
        return sum(request in got for got in self.received)


@pytest.fixture
async def target() -> AsyncIterator[tuple[Upper, int]]:
    upper = Upper()
    server = await asyncio.start_server(upper.handle, "127.0.0.1", 0)
    yield upper, int(server.sockets[0].getsockname()[1])
    server.close()


@pytest.fixture
async def proxy(target: tuple[Upper, int]) -> AsyncIterator[Proxy]:
    with Proxy("127.0.0.1", target[1]) as p:
        yield p


_open: list[asyncio.StreamWriter] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for writer in _open:
        writer.close()
    _open.clear()


async def connect(port: int) -> Conn:
    conn = await asyncio.open_connection("127.0.0.1", port)
    _open.append(conn[1])
    return conn


async def ask(conn: Conn, request: bytes) -> bytes:
    reader, writer = conn
    writer.write(request)
    await writer.drain()
    return await asyncio.wait_for(reader.readexactly(len(request)), DEADLINE_S)


async def until_closed(reader: asyncio.StreamReader) -> bytes:
    """Everything that arrived before the connection ended, by EOF or reset."""
    got = bytearray()
    try:
        async with asyncio.timeout(DEADLINE_S):
            while data := await reader.read(65536):
                got += data
    except ConnectionResetError:
        pass
    return bytes(got)


async def test_forwards_five_megabytes_both_ways_and_the_eof(proxy: Proxy, target: tuple[Upper, int]) -> None:
    upper, _ = target
    payload = os.urandom(5_000_000)
    reader, writer = await connect(proxy.port)

    async def send() -> None:
        writer.write(payload)
        await writer.drain()
        writer.write_eof()

    _, answer = await asyncio.gather(send(), until_closed(reader))
    assert answer == payload.upper()  # the server's EOF came back after the whole answer
    assert upper.received == [bytearray(payload)]


async def test_latency_delays_every_chunk_and_keeps_their_order(
    proxy: Proxy, target: tuple[Upper, int]
) -> None:
    upper, _ = target
    conn = await connect(proxy.port)
    proxy.set_latency(0.05)
    started = time.monotonic()
    assert await ask(conn, b"ping\n") == b"PING\n"
    assert time.monotonic() - started >= 2 * 0.05 - 0.001  # once each way

    proxy.set_latency(0.01, jitter=0.05)  # jitter larger than the pacing: a reordering proxy would show it
    lines = [f"line {i}\n".encode() for i in range(100)]
    reader, writer = conn

    async def send() -> None:
        for line in lines:
            writer.write(line)
            await writer.drain()
            await asyncio.sleep(0.002)  # pacing, so the lines travel as separate chunks

    expected = b"".join(lines)
    _, answer = await asyncio.gather(send(), asyncio.wait_for(reader.readexactly(len(expected)), DEADLINE_S))
    assert answer == expected.upper()
    assert upper.received[0] == b"ping\n" + expected


async def test_drop_all_closes_both_sides_and_new_connections_work(
    proxy: Proxy, target: tuple[Upper, int]
) -> None:
    upper, _ = target
    conns = [await connect(proxy.port) for _ in range(2)]
    for conn in conns:
        assert await ask(conn, b"hi\n") == b"HI\n"
    assert proxy.drop_all() == 2
    assert proxy.dropped == 2
    for reader, _ in conns:
        assert await until_closed(reader) == b""
    await until(lambda: upper.closed == 2, timeout=DEADLINE_S, what="the server's side closed")
    assert await ask(await connect(proxy.port), b"again\n") == b"AGAIN\n"
    assert proxy.accepted == 3


async def test_refuse_is_a_partition_for_new_connections_only(
    proxy: Proxy, target: tuple[Upper, int]
) -> None:
    upper, _ = target
    before = await connect(proxy.port)
    assert await ask(before, b"one\n") == b"ONE\n"
    proxy.refuse(True)
    reader, _ = await connect(proxy.port)  # the listener still accepts...
    assert await until_closed(reader) == b""  # ...and closes at once
    assert proxy.dropped == 1
    assert await ask(before, b"two\n") == b"TWO\n"  # an open connection goes on
    proxy.refuse(False)
    assert await ask(await connect(proxy.port), b"back\n") == b"BACK\n"
    assert len(upper.received) == 2  # the refused connection never reached the server


async def test_a_cut_reply_was_received_by_the_server_but_never_reaches_the_client(
    proxy: Proxy, target: tuple[Upper, int]
) -> None:
    upper, _ = target
    proxy.cut_on_reply(b"DONE", times=2)
    for _ in range(2):
        conn = await connect(proxy.port)
        assert await ask(conn, b"hello\n") == b"HELLO\n"  # replies before the cut get through
        reader, writer = conn
        writer.write(b"done\n")
        assert await until_closed(reader) == b""
    assert upper.saw(b"done\n") == 2
    assert proxy.cuts == 2
    await until(lambda: upper.closed == 2, timeout=DEADLINE_S, what="the server's side closed")
    assert await ask(await connect(proxy.port), b"done\n") == b"DONE\n"  # spent after `times` cuts
    assert proxy.cuts == 2


async def test_a_cut_reply_discards_what_is_still_queued_for_the_client(proxy: Proxy) -> None:
    proxy.set_latency(0.5)  # PART-ONE is still waiting in the proxy when DONE arrives
    proxy.cut_on_reply(b"DONE")
    reader, writer = await connect(proxy.port)
    writer.write(b"two-part\n")
    assert await until_closed(reader) == b""
    assert proxy.cuts == 1


async def test_a_cut_request_reaches_the_server_then_the_connection_goes(
    proxy: Proxy, target: tuple[Upper, int]
) -> None:
    upper, _ = target
    rounds = 20  # the server answers at once: each round races its answer against the abort
    proxy.cut_on_request(b"pay", times=rounds)
    for i in range(rounds):
        conn = await connect(proxy.port)
        assert await ask(conn, b"hello\n") == b"HELLO\n"
        reader, writer = conn
        writer.write(f"pay {i}\n".encode())
        assert await until_closed(reader) == b""
    await until(lambda: upper.saw(b"pay ") == rounds, timeout=DEADLINE_S, what="every request at the server")
    assert all(f"pay {i}\n".encode() in upper.received[i] for i in range(rounds))
    assert proxy.cuts == rounds
    assert await ask(await connect(proxy.port), b"pay 99\n") == b"PAY 99\n"  # spent


async def test_stop_closes_everything_even_with_chunks_in_flight(target: tuple[Upper, int]) -> None:
    proxy = Proxy("127.0.0.1", target[1])
    proxy.start()
    conn = await connect(proxy.port)
    assert await ask(conn, b"hi\n") == b"HI\n"
    proxy.set_latency(30)
    reader, writer = conn
    writer.write(b"slow\n")
    await writer.drain()
    proxy.stop()  # neither waits for the 30 s nor hangs: it raises if its thread outlives it
    assert await until_closed(reader) == b""
    with pytest.raises(OSError):
        await connect(proxy.port)


def test_url_for_replaces_only_the_address() -> None:
    with Proxy("db.internal", 5432) as p:
        assert p.port > 0
        pg = "postgresql://user:pw@db.internal:5432/timers?sslmode=disable"
        assert p.url_for(pg) == f"postgresql://user:pw@127.0.0.1:{p.port}/timers?sslmode=disable"
        assert (
            p.url_for("postgresql://user@db.internal/timers")
            == f"postgresql://user@127.0.0.1:{p.port}/timers"
        )
        assert p.url_for("nats://nats:4222") == f"nats://127.0.0.1:{p.port}"
        assert p.url_for("nats://token@nats:4222") == f"nats://token@127.0.0.1:{p.port}"
