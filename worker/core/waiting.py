"""The one way a loop waits: until one of some events is set, or a timeout passes."""

from __future__ import annotations

import asyncio


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
