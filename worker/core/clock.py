"""The replica's estimate of the database clock: never ahead of it, so never early.

The estimate is the latest clock_timestamp() reading, carried forward on the monotonic clock at the
slowest rate the database clock may run (MAX_DRIFT). A lower reading replaces it too: it is either
delayed or the database clock stepped back (a failover), and the two cannot be told apart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

# NTP slews at most 500 ppm.
MAX_DRIFT = 500e-6


class Clock(Protocol):
    """The database clock as a replica knows it (tests/twins.py's fake runs on no real time)."""

    def observe(self, reading: datetime, received: float | None = None) -> None: ...
    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class DbClock:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._at = monotonic()  # when the reading arrived, on the monotonic clock
        self._reading = time.time()  # a first guess until a claim reads the database clock

    def observe(self, reading: datetime, received: float | None = None) -> None:
        """A reading of the database clock, received at `received` on the monotonic clock (None: now);
        the earlier that is known, the less the estimate lags."""
        self._at = self._monotonic() if received is None else received
        self._reading = reading.timestamp()

    def now(self) -> float:
        """The database clock in epoch seconds: never ahead, at most a reading's delay (and drift)
        behind."""
        return self._reading + (self._monotonic() - self._at) * (1 - MAX_DRIFT)

    async def sleep(self, seconds: float) -> None:
        """Let about `seconds` pass (maybe a little less: read now() again after)."""
        await asyncio.sleep(seconds)
