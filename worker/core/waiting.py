"""How a loop waits: until one of some events is set or a timeout passes, and between the
attempts of a write a transient failure interrupted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from worker.errors import TransientError

T = TypeVar("T")


async def wait_any(timeout: float | None, *events: asyncio.Event) -> bool:
    """Wait until one of `events` is set or `timeout` seconds pass; True when one is set.

    Each loop sleeps this way between rounds, with its stop event among `events`, so a stop ends
    every wait at once. The waiters are cancelled on every way out, a cancellation included.
    """
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
    """`call()`, tried again after each TransientError until `within_s` seconds have passed; then
    that error is raised. The waits double from `first_s` up to `max_s`. Any other error is raised
    at once (errors.verdict decided what is transient)."""
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(TransientError),
        stop=stop_after_delay(within_s),
        wait=wait_exponential(multiplier=first_s, max=max_s),
        reraise=True,
    )

    async def attempt() -> T:  # a coroutine function: tenacity would not await a lambda's result
        return await call()

    return await retrying(attempt)


# How long a piece of work holds the event loop before Slices hands it back: a claim's next
# occurrences, an intake batch's checks. A step costs microseconds, but a tenant can choose steps
# that cost milliseconds (worker/core/recurrence.py): a batch of them held a replica for seconds.
SLICE_S = 0.01


class Slices:
    """Hands the event loop back once every `every_s` of a long piece of work, which calls
    `check()` between its steps: what a tenant's input costs a step (a cron schedule's next
    occurrence, a command's check) must not hold every other task of the replica up with it."""

    __slots__ = ("_ends", "_every_s")

    def __init__(self, every_s: float = SLICE_S) -> None:
        self._every_s = every_s
        self._ends = time.perf_counter() + every_s

    async def check(self) -> None:
        if time.perf_counter() > self._ends:
            await asyncio.sleep(0)
            self._ends = time.perf_counter() + self._every_s
