"""How the `timer-service` commands reach NATS: once, giving up at once when it is not there."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import nats.errors
from nats.js import JetStreamContext

from worker.config import Settings


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: without one it logs every failed attempt with a traceback. The
    failure itself is raised, and main() reports it once."""


def _nats_options() -> dict[str, Any]:
    # A command-line tool gives up at once on a NATS that is not there (a replica waits forever).
    return {"allow_reconnect": False, "max_reconnect_attempts": 1, "error_cb": _quiet}


async def _with_client(settings: Settings, action: Callable[[Any], Any]) -> Any:
    from worker.adapters.jetstream.options import connect_options
    from worker.client import TimerClient

    opts = connect_options(settings) | _nats_options()
    servers = opts.pop("servers")
    async with await TimerClient.connect(servers, settings.subject_prefix, **opts) as client:
        return await action(client)


@contextlib.asynccontextmanager
async def _jetstream(settings: Settings) -> AsyncIterator[JetStreamContext]:
    from worker.adapters.jetstream.options import connect_options
    from worker.client.wire import nats_connect

    opts = connect_options(settings) | _nats_options()
    nc = await nats_connect(opts.pop("servers"), **opts)
    try:
        yield nc.jetstream(timeout=5)
    finally:
        await nc.close()


def _backlog(settings: Settings, running: int) -> tuple[Any, str | None]:
    """(the command backlog or None, why it is unknown): for `status` and `describe`, which
    answer from the database even when NATS is not there. `running`: the replicas alive by their
    stats (worker/ops/fleet.py says why NATS alone cannot count them)."""
    from worker.ops.fleet import command_backlog

    async def read() -> Any:
        async with _jetstream(settings) as js:
            return await command_backlog(js, settings, running)

    try:
        found = asyncio.run(read())
    except (OSError, nats.errors.Error) as exc:
        return None, f"unknown, NATS did not answer (TIMER_NATS_URL): {_first_line(exc)}"
    return found, None if found is not None else "unknown: no replica has created the command consumer yet"


# main's one-line report of a failure too: it lives here, beside _backlog, because cli.py imports
# this module and not the reverse (tests/unit/test_layout.py refuses an import circle).
def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
