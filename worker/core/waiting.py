"""How a loop waits: for an event or a timeout, and between a write's attempts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from worker.errors import TransientError

T = TypeVar("T")


async def wait_any(timeout: float | None, *events: asyncio.Event) -> bool:
    """Wait until one of `events` is set or `timeout` seconds pass; True when one is set. With the stop
    event among `events`, a stop ends every wait at once."""
    if any(e.is_set() for e in events):
        return True
    waiters = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waiters:
            w.cancel()
    return any(e.is_set() for e in events)


async def retry_transient(
    call: Callable[[], Awaitable[T]], within_s: float, first_s: float, max_s: float
) -> T:
    """`call()`, retried on TransientError for `within_s` seconds, waits doubling from `first_s` to
    `max_s`; then that error is raised. Any other error is raised at once."""
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(TransientError),
        stop=stop_after_delay(within_s),
        wait=wait_exponential(multiplier=first_s, max=max_s),
        reraise=True,
    )

    async def attempt() -> T:  # tenacity would not await a lambda's result
        return await call()

    return await retrying(attempt)


# How long a piece of work holds the event loop before Slices hands it back: a tenant can choose costly
# steps.
SLICE_S = 0.01


class Slices:
    """Hands the event loop back every `every_s` of a long piece of work that calls `check()` between
    steps, so a tenant's costly input does not hold up the replica's other tasks."""

    __slots__ = ("_ends", "_every_s")

    def __init__(self, every_s: float = SLICE_S) -> None:
        self._every_s = every_s
        self._ends = time.perf_counter() + every_s

    async def check(self) -> None:
        if time.perf_counter() > self._ends:
            await asyncio.sleep(0)
            self._ends = time.perf_counter() + self._every_s
