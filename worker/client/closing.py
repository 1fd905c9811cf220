"""A NATS connection closed within a bound whatever the server does: its subscriptions drained, what
was published flushed, then the close (for the producer client and the service's broker alike)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import Any, Protocol

from nats.aio.client import Client as NATS


class Drainable(Protocol):
    """What close_within drains: a nats-py Subscription, or one with more to wait for."""

    def drain(self) -> Awaitable[None]: ...


# Of close_within's time, what the close keeps after the drain and flush: a server that answers
# takes a moment to close on; one that does not, no time at all.
CLOSE_SHARE = 0.25


async def close_within(nc: NATS, timeout: float, subscriptions: Iterable[Drainable] = ()) -> bool:
    """Drain these subscriptions (the messages they hold handled), flush what was published to the
    server and close `nc`, all within `timeout` seconds whatever the server does; whether every
    step finished in time. The close always runs: the socket goes, and what it still had to write
    is lost, as with a connection that breaks.

    Not nats-py's Client.drain: it swallows a cancellation and then waits on a flush of its own,
    10 s, so a timeout around it does not bound it (a server that stopped answering without
    resetting the connection, a partition or a frozen process, held a stopping replica 15 s past
    its drain timeout). Here each step is a task waited for with the time left; one out of time is
    cancelled (these steps end when cancelled) and not waited for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def drain() -> None:
        if nc.is_connected:
            # One that cannot drain (unsubscribed already) keeps neither the others nor the flush.
            await asyncio.gather(*(s.drain() for s in subscriptions), return_exceptions=True)
            await nc.flush(timeout=max(deadline - loop.time(), 0.001))  # type: ignore[arg-type]  # a float

    drained = await _within(drain(), (1 - CLOSE_SHARE) * timeout)
    closed = nc.is_closed or await _within(nc.close(), deadline - loop.time())
    return drained and closed


async def _within(step: Awaitable[None], seconds: float) -> bool:
    """Whether `step` ended without an error within `seconds`; cancelled, and left, if not."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait([task], timeout=max(seconds, 0))
    if not done:
        task.cancel()
        task.add_done_callback(_seen)  # its end, if it comes, is nobody's business now
        return False
    return not task.cancelled() and task.exception() is None


def _seen(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" at exit
