"""A replica's HTTP endpoints: /healthz (loops alive), /readyz (dependencies up), /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

log = logging.getLogger(__name__)

# A probe: (passes, one line saying why) for /healthz or /readyz.
Probe = Callable[[], Awaitable[tuple[bool, str]]]


class HttpServer:
    def __init__(self, host: str, port: int, healthy: Probe, ready: Probe) -> None:
        self.host, self.port = host, port
        self._healthy, self._ready = healthy, ready
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the bound port (useful when port 0 asked for any free one)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        port: int = self._server.sockets[0].getsockname()[1]
        log.info("http listening", extra={"action": "http_listening", "port": port})
        return port

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), timeout=2)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, path = (part.decode() for part in request.split(b" ", 2)[:2])
            status, ctype, body = await self._route(method, path.split("?")[0])
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            method, (status, ctype, body) = "", (400, "text/plain", b"bad request\n")
        allow = "Allow: GET, HEAD\r\n" if status == 405 else ""
        head = (
            f"HTTP/1.1 {status} {'OK' if status == 200 else 'ERROR'}\r\n"
            f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{allow}Connection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            # HEAD: GET's status and headers, Content-Length included, without the body.
            writer.write(head.encode() + (b"" if method == "HEAD" else body))
            await writer.drain()
            writer.close()

    async def _route(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):  # HEAD: what a monitor or a load balancer checks with
            return 405, "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest()
        probes = {"/healthz": self._healthy, "/readyz": self._ready}
        if path not in probes:
            return 404, "text/plain", b"not found\n"
        ok, detail = await probes[path]()
        return (200 if ok else 503), "text/plain", (detail + "\n").encode()
