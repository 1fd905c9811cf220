"""The writes a replica has in flight, so readiness can tell a stalled primary (a COMMIT waiting for
a lost synchronous standby, never cut short: docs/OPERATIONS.md) from a slow one."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Writes:
    """The start (monotonic) of each write transaction in flight, until its COMMIT answers."""

    def __init__(self) -> None:
        self._started: dict[int, float] = {}
        self._ids = itertools.count()

    @contextmanager
    def writing(self) -> Iterator[None]:
        key = next(self._ids)
        self._started[key] = time.monotonic()
        try:
            yield
        finally:
            del self._started[key]

    def oldest_s(self) -> float:
        """How long the oldest write in flight has been waiting; 0 with none."""
        return time.monotonic() - min(self._started.values()) if self._started else 0.0
