"""worker/adapters/http_server.py: GET and HEAD on every route, and /metrics without `_created`
series."""

from __future__ import annotations

import asyncio

from worker import metrics  # noqa: F401  # the replica's metrics, registered as it registers them
from worker.adapters.http_server import HttpServer


async def _ok() -> tuple[bool, str]:
    return True, "ok"


async def _ask(port: int, method: str, path: str) -> tuple[str, dict[str, str], bytes]:
    """(status line, headers, body) of one request, read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    raw = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    return status, {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}, body


async def test_head_answers_as_get_without_the_body() -> None:
    server = HttpServer("127.0.0.1", 0, _ok, _ok)
    port = await server.start()
    try:
        for path in ("/metrics", "/healthz", "/readyz"):
            status, headers, _ = await _ask(port, "GET", path)
            head_status, head_headers, head_body = await _ask(port, "HEAD", path)
            assert status == head_status == "HTTP/1.1 200 OK", (path, head_status)
            assert head_body == b"" and int(head_headers["content-length"]) > 0, path
            assert head_headers["content-type"] == headers["content-type"], path
        status, headers, _ = await _ask(port, "POST", "/metrics")
        assert status.startswith("HTTP/1.1 405") and headers["allow"] == "GET, HEAD", headers
    finally:
        await server.close()


async def test_metrics_have_no_created_twins() -> None:
    server = HttpServer("127.0.0.1", 0, _ok, _ok)
    port = await server.start()
    try:
        _, _, body = await _ask(port, "GET", "/metrics")
    finally:
        await server.close()
    text = body.decode()
    assert "timer_commands_received_total" in text or "timer_fired_total" in text, text[:500]
    assert "_created" not in text, [line for line in text.splitlines() if "_created" in line][:3]
