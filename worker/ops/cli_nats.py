"""How a command-line run talks to NATS: it gives up at once on a server that is not there, and
says a failure once (main() prints it as one line)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from nats.js import JetStreamContext

from worker.config import Settings


async def quiet(exc: Exception) -> None:
    """nats-py's error callback: without one it logs every failed attempt with a traceback. The
    failure itself is raised, and main() reports it once."""


def nats_options() -> dict[str, Any]:
    # A command-line tool gives up at once on a NATS that is not there (a replica waits forever).
    return {"allow_reconnect": False, "max_reconnect_attempts": 1, "error_cb": quiet}


async def with_client(settings: Settings, action: Callable[[Any], Any]) -> Any:
    from worker.adapters.broker import connect_options
    from worker.client import TimerClient

    opts = connect_options(settings) | nats_options()
    servers = opts.pop("servers")
    async with await TimerClient.connect(servers, settings.subject_prefix, **opts) as client:
        return await action(client)


@contextlib.asynccontextmanager
async def jetstream(settings: Settings) -> AsyncIterator[JetStreamContext]:
    from worker.adapters.broker import connect_options
    from worker.natsconn import nats_connect

    opts = connect_options(settings) | nats_options()
    nc = await nats_connect(opts.pop("servers"), **opts)
    try:
        yield nc.jetstream(timeout=5)
    finally:
        await nc.close()


def first_line(exc: BaseException) -> str:
    """What the CLI says of an error it reports: its first line (a server's answer may run on)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
