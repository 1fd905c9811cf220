"""A TCP proxy that injects network faults between a replica and Postgres or NATS: latency,
dropped connections, a partition, and replies lost after the server did the work (an ambiguous
outcome: committed, or stored and acknowledged, but the client never hears of it)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal, Self, TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")
Direction = Literal["request", "reply"]

CHUNK = 65536
QUEUED_CHUNKS = 64  # per direction: a full queue stops the reading, so back-pressure reaches the sender
CALL_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0


@dataclass
class _Chunk:
    at: float  # loop time it may be delivered
    data: bytes
    last: bool = False  # a cut request: deliver it, then abort the connection


class _Link:
    """One proxied connection: the client's side, the server's, and the four tasks between them."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client, self.server = client, server
        self.tasks: list[asyncio.Task[None]] = []
        self.muted = False  # once set, nothing more reaches the client

    def abort(self) -> None:
        self.muted = True
        for writer in (self.client, self.server):
            writer.transport.abort()
        current = asyncio.current_task()
        for task in self.tasks:
            if task is not current:
                task.cancel()  # a chunk still waiting out its latency dies with the connection


class Proxy:
    """Listens on 127.0.0.1:<port> and forwards every connection to target_host:target_port.

    Runs its own asyncio loop in a daemon thread so synchronous and async tests can both drive it.
    Every control method is thread-safe and takes effect at once.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self.cuts = 0
        self.accepted = 0  # refused ones included: the listener accepts them before closing them
        self.dropped = 0
        self._latency = (0.0, 0.0)
        self._refusing = False
        self._armed: dict[tuple[Direction, bytes], int] = {}  # cuts still to make, by direction and pattern
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())

    def stop(self) -> None:
        """Close the listener and every connection, and end the thread."""
        if not self._thread.is_alive():
            return
        try:
            self._call(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=STOP_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError("the proxy's thread did not stop")
        self._loop.close()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def url_for(self, url: str) -> str:
        """The same URL (postgresql://, nats://) through this proxy: user, password, path and query kept."""
        parts = urlsplit(url)
        userinfo, at, _ = parts.netloc.rpartition("@")
        return parts._replace(netloc=f"{userinfo}{at}127.0.0.1:{self.port}").geturl()

    def set_latency(self, seconds: float, jitter: float = 0.0) -> None:
        """Delay every chunk read from now on, both ways, by seconds + uniform(0, jitter), in order."""
        self._latency = (seconds, jitter)

    def drop_all(self) -> int:
        """Abort every open connection, both sides; how many there were."""
        if not self._thread.is_alive():
            return 0
        return self._call(self._drop_all())

    def refuse(self, on: bool) -> None:
        """While on, new connections are closed as soon as they are accepted (a partition); open
        ones stay unless dropped."""
        self._refusing = on

    def cut_on_reply(self, pattern: bytes, times: int = 1) -> None:
        """The next `times` server chunks holding `pattern` are lost, with all still queued for their
        client, and their connection aborted: the server did the work, the client never hears of it."""
        self._arm("reply", pattern, times)

    def cut_on_request(self, pattern: bytes, times: int = 1) -> None:
        """The next `times` client chunks holding `pattern` reach the server, then their connection is
        aborted before anything more from the server reaches the client."""
        self._arm("request", pattern, times)

    def _arm(self, way: Direction, pattern: bytes, times: int) -> None:
        with self._lock:
            if (left := self._armed.get((way, pattern), 0) + times) > 0:
                self._armed[(way, pattern)] = left

    def _take_cut(self, way: Direction, data: bytes) -> bool:
        # Matched per received chunk: a pattern split across two chunks is missed.
        with self._lock:
            key = next((key for key in self._armed if key[0] == way and key[1] in data), None)
            if key is not None and (left := self._armed.pop(key) - 1):
                self._armed[key] = left
            return key is not None

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=CALL_TIMEOUT_S)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _drop_all(self) -> int:
        links = list(self._links)
        for link in links:
            link.abort()
        self.dropped += len(links)
        return len(links)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        # Every connection's handler aborts its link when cancelled, even one still dialling the target.
        others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _serve(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        # Ends quietly when stop() cancels it: Python 3.11 logs an error for a cancelled handler.
        with contextlib.suppress(asyncio.CancelledError):
            await self._forward(client_in, client_out)

    async def _forward(self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self._refusing:
            self.dropped += 1
            client_out.transport.abort()
            return
        try:
            server_in, server_out = await asyncio.open_connection(*self.target)
        except OSError:
            client_out.transport.abort()  # the target is down: the client sees its connection fail
            return
        except asyncio.CancelledError:
            client_out.transport.abort()  # stop() came first
            raise
        link = _Link(client_out, server_out)
        requests: asyncio.Queue[_Chunk | None] = asyncio.Queue(QUEUED_CHUNKS)
        replies: asyncio.Queue[_Chunk | None] = asyncio.Queue(QUEUED_CHUNKS)
        link.tasks = [
            asyncio.create_task(self._read(link, client_in, requests, "request")),
            asyncio.create_task(self._send(link, requests, server_out)),
            asyncio.create_task(self._read(link, server_in, replies, "reply")),
            asyncio.create_task(self._send(link, replies, client_out)),
        ]
        self._links.add(link)
        try:
            await asyncio.wait(link.tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            self._links.discard(link)
            ended = all(t.done() and not t.cancelled() and t.exception() is None for t in link.tasks)
            if ended:  # both sides closed their end and everything was delivered
                client_out.close()
                server_out.close()
            else:  # a reset on one side, a cut, a drop or stop(): reset the other side too
                link.abort()
            await asyncio.gather(*link.tasks, return_exceptions=True)

    async def _read(
        self, link: _Link, reader: asyncio.StreamReader, queue: asyncio.Queue[_Chunk | None], way: Direction
    ) -> None:
        loop = asyncio.get_running_loop()
        while data := await reader.read(CHUNK):
            cut = self._take_cut(way, data)
            if cut and way == "reply":
                self.cuts += 1
                link.abort()
                return
            base, jitter = self._latency
            await queue.put(_Chunk(loop.time() + base + random.uniform(0, jitter), data, last=cut))
            if cut:  # the client is heard no more: its sender aborts once this chunk is delivered
                return
        await queue.put(None)  # the peer's EOF, passed on after everything before it

    async def _send(
        self, link: _Link, queue: asyncio.Queue[_Chunk | None], writer: asyncio.StreamWriter
    ) -> None:
        # One sender per direction, in queue order: a chunk waits out its own latency only after
        # the one before it went, so jitter never reorders a stream.
        loop = asyncio.get_running_loop()
        while (chunk := await queue.get()) is not None:
            if (wait := chunk.at - loop.time()) > 0:
                await asyncio.sleep(wait)  # the injected latency
            if link.muted:
                return
            if chunk.last:
                link.muted = True  # replies to the cut request, or already on their way, are lost
                writer.write(chunk.data)
                writer.transport.set_write_buffer_limits(high=0)  # drain() now waits for every byte
                await writer.drain()
                self.cuts += 1
                link.abort()
                return
            writer.write(chunk.data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
