"""Poll until a check answers (anything but None or False, 0 included), or fail at a deadline
saying `what` was awaited (a string, or a function called only then)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast, overload

T = TypeVar("T")

What = str | Callable[[], str]


class _Deadline:
    def __init__(self, timeout: float, what: What) -> None:
        self.timeout, self.what = timeout, what
        self.at = time.monotonic() + timeout

    def found(self, value: object) -> bool:
        """True when `value` is an answer; raise TimeoutError once the deadline has passed."""
        if value is not None and value is not False:
            return True
        if time.monotonic() > self.at:
            what = self.what if isinstance(self.what, str) else self.what()
            raise TimeoutError(f"timed out after {round(self.timeout, 2):g}s waiting for {what}")
        return False


def until(
    check: Callable[[], T | None], timeout: float = 20.0, what: What = "condition", interval: float = 0.02
) -> T:
    """Call `check` every `interval` seconds until it answers; TimeoutError after `timeout`."""
    deadline = _Deadline(timeout, what)
    while not deadline.found(value := check()):
        time.sleep(interval)
    return cast(T, value)  # found() ruled out None


@overload
async def until_async(
    check: Callable[[], Awaitable[T | None]],
    timeout: float = ...,
    what: What = ...,
    interval: float = ...,
) -> T: ...
@overload
async def until_async(
    check: Callable[[], T | None], timeout: float = ..., what: What = ..., interval: float = ...
) -> T: ...
async def until_async(
    check: Callable[[], object],
    timeout: float = 20.0,
    what: What = "condition",
    interval: float = 0.02,
) -> object:
    """`until` on an event loop: `check` may be a coroutine function; the waits let other tasks run."""
    deadline = _Deadline(timeout, what)
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if deadline.found(value):
            return value
        await asyncio.sleep(interval)
