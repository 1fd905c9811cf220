"""A NATS connection drained, flushed and closed within a bound, whatever the server does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from nats.aio.client import Client as NATS


class Drainable(Protocol):
    def drain(self) -> Awaitable[None]: ...


# The share of close_within's time kept for the close after the drain and flush.
CLOSE_SHARE = 0.25


async def close_within(nc: NATS, timeout: float, subscriptions: Iterable[Drainable] = ()) -> bool:
    """Drain `subscriptions`, flush and close `nc` within `timeout`; whether all was in time. Not
    nats-py's drain, which a timeout does not bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def drain() -> None:
        if nc.is_connected:
            # One that cannot drain keeps neither the others nor the flush.
            await asyncio.gather(*(s.drain() for s in subscriptions), return_exceptions=True)
            await nc.flush(timeout=max(deadline - loop.time(), 0.001))  # type: ignore[arg-type]  # a float

    drained = await _within(drain(), (1 - CLOSE_SHARE) * timeout)
    closed = nc.is_closed or await _within(nc.close(), deadline - loop.time())
    return drained and closed


async def _within(step: Awaitable[None], seconds: float) -> bool:
    """Whether `step` ended without an error within `seconds`; cancelled if not."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait([task], timeout=max(seconds, 0))
    if not done:
        task.cancel()
        task.add_done_callback(_seen)
        return False
    return not task.cancelled() and task.exception() is None


def _seen(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # no "exception was never retrieved" at exit
