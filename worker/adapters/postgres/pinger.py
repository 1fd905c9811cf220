"""Readiness's own connection to Postgres, outside the pool: the pool's connections may all be in
batches whose COMMIT waits, or gone in a failover, and a ping waiting for one would time out.
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from worker.adapters.postgres.queries import QUERIES

# Below the readiness probe's timeout: the probe gets "not ready" and why, not a timeout of its own.
PING_TIMEOUT_S = 1.5


class PingTimeout(TimeoutError):
    """No answer (connect or SELECT) within the bound: a host that does not reply."""


class Pinger:
    """One ping at a time on one connection; callers that arrive while it is in flight share it."""

    def __init__(self, conninfo: str, kwargs: dict[str, Any], timeout_s: float = PING_TIMEOUT_S) -> None:
        self._conninfo = conninfo
        self._kwargs = kwargs
        self.timeout_s = timeout_s
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._flight: asyncio.Task[None] | None = None
        # Pings given up on, still unwinding (psycopg cancels the statement in the server first).
        self._abandoned: set[asyncio.Task[None]] = set()

    @classmethod
    def beside(cls, pool: AsyncConnectionPool[Any]) -> Pinger:
        """A pinger on the pool's own conninfo and connection settings (adapters/db.pool)."""
        conninfo, kwargs = pool.conninfo, pool.kwargs
        if not isinstance(conninfo, str) or not isinstance(kwargs, dict):  # db.pool gives both
            raise TypeError("the pool's conninfo and kwargs must be fixed values to ping beside it")
        return cls(conninfo, kwargs)

    async def ping(self) -> None:
        """Return once the server answered; raise psycopg.Error or PingTimeout within timeout_s."""
        if self._flight is None or self._flight.done():
            self._flight = asyncio.create_task(self._ping(), name="db-ping")
        flight = self._flight
        # asyncio.wait neither cancels the flight when this caller is cancelled nor raises its error.
        done, _ = await asyncio.wait({flight}, timeout=self.timeout_s)
        if not done or flight.cancelled():
            self._abandon(flight)
            raise PingTimeout(f"no answer from Postgres within {self.timeout_s:g}s")
        flight.result()

    async def _ping(self) -> None:
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                await self._select(conn)
                return
            except psycopg.OperationalError:
                # Ended while idle: a new connection asks about the server now.
                pass
        await self._select(await self._connect())

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(self._conninfo, **self._kwargs)
        self._conn = conn
        return conn

    async def _select(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            await conn.execute(QUERIES["ping"])
        except BaseException:
            # Broken, cancelled or refused: the next ping starts on a new connection.
            if self._conn is conn:
                self._conn = None
            await conn.close()
            raise

    def _abandon(self, flight: asyncio.Task[None]) -> None:
        """Give up on a ping that did not answer: the next one does not queue behind it."""
        if self._flight is flight:
            self._flight = None
            self._conn = None  # the flight closes it as it unwinds
        if not flight.done():
            flight.cancel()
            self._abandoned.add(flight)
            flight.add_done_callback(self._abandoned.discard)

    async def close(self) -> None:
        """Cancel what is in flight and close the connection (the replica is stopping)."""
        tasks = [*self._abandoned, *([self._flight] if self._flight else [])]
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a ping stuck on a dead host's socket is left to the event loop's end
            await asyncio.wait(tasks, timeout=self.timeout_s)
        self._flight = None
        if self._conn is not None:
            await self._conn.close()
            self._conn = None
