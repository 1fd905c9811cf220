"""The writes a replica has in flight, so readiness can tell a stalled primary from a slow one.

A primary whose synchronous standby left (an orphan after Patroni alone died, the standby
promoted elsewhere; `synchronous_mode_strict` with no standby) still answers every read, readiness's
`SELECT 1` included, while each COMMIT that wrote something waits for a standby that never
confirms. Nothing fails, so nothing said so: the replicas stopped firing with /readyz green.

The wait is never cut short by the service (docs/OPERATIONS.md, "High availability"): a COMMIT
cancelled while it waits for the standby is committed on the primary alone and reported as done
with a warning, and lost when that primary is rewound. So no statement_timeout, lock_timeout or
asyncio timeout wraps a commit; idle_in_transaction_session_timeout (the lease) ends only a session
idle in its transaction, never one whose COMMIT is running; a replica's hard stop cancels its loops,
and a cancelled commit is then never taken as done (the command not acknowledged, the firing not
marked: both come back). Readiness only reports the wait, as the age of the oldest write here.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Writes:
    """The start of each write transaction in flight (monotonic), from its first statement on a
    connection in hand to its COMMIT's answer: the intake's batches, the firing's marks."""

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
