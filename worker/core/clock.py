"""The replica's estimate of the database clock: never ahead of it, so never early.

A reading of clock_timestamp(), received now, is behind the database clock by however long it
took to arrive: a lower bound of the database clock at this instant. Carried forward on the
monotonic clock, it stays one only while neither clock misbehaves, and both may: NTP slews a
clock by up to 500 ppm, and a primary failover can land on a host whose clock is behind (a step
back). So the estimate is the latest reading, carried forward at the slowest rate the database
clock may run against ours (MAX_DRIFT), and a new reading replaces it even when lower: a lower
reading is either delayed (the estimate was sound) or the clock stepped back (it was ahead), and
the two cannot be told apart. Keeping the largest reading, as this once did, published
claimed-ahead occurrences early by up to drift times the window, or by a whole step back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Protocol

# The fastest the two clocks may drift apart: NTP slews at most 500 ppm.
MAX_DRIFT = 500e-6


class Clock(Protocol):
    """The database clock as a replica knows it (the fake in tests/twins.py runs on no real time)."""

    def observe(self, reading: datetime, received: float | None = None) -> None: ...
    def now(self) -> float: ...
    async def sleep(self, seconds: float) -> None: ...


class DbClock:
    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._at = monotonic()  # when the reading arrived, on the monotonic clock
        self._reading = time.time()  # a first guess until a claim reads the database clock

    def observe(self, reading: datetime, received: float | None = None) -> None:
        """A reading of the database clock, received at `received` on the monotonic clock (None:
        just now). The earlier that is known, the less the estimate lags: a claim's reading
        arrives with its rows, and reading them and getting back to the loop took 0.9 ms at the
        median at 1,000 due/s, which each occurrence of the claim was published later by."""
        self._at = self._monotonic() if received is None else received
        self._reading = reading.timestamp()

    def now(self) -> float:
        """The database clock in epoch seconds: never ahead of it, at most a reading's delay behind
        (plus MAX_DRIFT of the time since that reading)."""
        return self._reading + (self._monotonic() - self._at) * (1 - MAX_DRIFT)

    async def sleep(self, seconds: float) -> None:
        """Let about `seconds` pass (maybe a little less: read now() again after)."""
        await asyncio.sleep(seconds)
