"""Readiness asks Postgres on a connection of its own (adapters/postgres/pinger.py), never the pool.

A replica's pool can be entirely out: every connection in a claim's batch whose COMMIT waits on a
stalled synchronous standby, or gone with a dead primary while the pool's reconnects fail. The
readiness ping then waited for a pool connection until its 2 s timeout, whatever Postgres said,
and the failover-sync chaos scenario saw /readyz answer "not ready" seconds late
(docs/RELIABILITY.md). These pin both answers while the pool is exhausted: "ready" while the
server answers, "not ready" from the server's own refusal (an error, not a timeout), and a bounded
"not ready" when the host stops answering, with a fresh connection for the next ping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from tests.chaos.proxy import Proxy
from tests.helpers import until
from worker.adapters.postgres import db
from worker.adapters.postgres.pinger import PING_TIMEOUT_S, Pinger, PingTimeout
from worker.adapters.postgres.store import Store
from worker.errors import TransientError

POOL = 2
APP = "readiness-test"


@pytest.fixture
async def store(db_url: str, proxy: Proxy) -> AsyncIterator[Store]:
    pool = db.pool(proxy.url_for(db_url), APP, min_size=POOL, max_size=POOL, idle_in_transaction_ms=60_000)
    await pool.open(wait=True, timeout=10)
    s = Store(pool)
    yield s
    proxy.drop_all()  # the hung statements end with their connections
    await s.close()
    await pool.close()


async def _hang_every_pool_connection(store: Store, db_url: str) -> list[asyncio.Task[None]]:
    """Every pool connection in a transaction that does not end (a COMMIT waiting for a standby
    that never confirms, as far as the pool can tell)."""

    async def hang() -> None:
        async with store.pool.connection() as conn, conn.transaction():
            await conn.execute("SELECT pg_sleep(600)")

    tasks = [asyncio.create_task(hang()) for _ in range(POOL)]

    def sleeping() -> bool:
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = %s AND query LIKE 'SELECT pg_sleep%%' AND state = 'active'",
                (APP,),
            ).fetchone()
        return bool(row and row[0] == POOL)

    await until(lambda: asyncio.to_thread(sleeping), timeout=20, what="every pool connection hanging")
    return tasks


async def _timed_ping(store: Store) -> float:
    started = time.monotonic()
    await store.ping()
    return time.monotonic() - started


async def test_readiness_answers_while_every_pool_connection_hangs(
    store: Store, db_url: str, proxy: Proxy
) -> None:
    hung = await _hang_every_pool_connection(store, db_url)
    assert store.pool.get_stats().get("pool_available", 0) == 0
    await store.ping()  # ready: the server answers, though the pool has nothing to lend

    # The server goes away (the primary died): its refusal is the answer, long before the bound.
    proxy.refuse(True)
    proxy.drop_all()
    for _ in range(2):  # on the broken connection and a refused new one; then a refused one alone
        started = time.monotonic()
        with pytest.raises(TransientError):
            await store.ping()
        assert time.monotonic() - started < PING_TIMEOUT_S, "not ready only once the ping timed out"
    for task in hung:
        with pytest.raises(psycopg.OperationalError):
            await task

    # Back (the standby promoted): ready on a new connection, the pool's still reconnecting or not.
    proxy.refuse(False)
    await until(lambda: _timed_ping(store), timeout=10, what="ready again")


async def test_a_host_that_stops_answering_is_not_ready_within_the_bound(db_url: str, proxy: Proxy) -> None:
    pinger = Pinger(proxy.url_for(db_url), {"autocommit": True}, timeout_s=0.5)
    try:
        await pinger.ping()
        proxy.set_latency(600)  # nothing comes back: a host gone without a reset
        started = time.monotonic()
        with pytest.raises(PingTimeout):
            await pinger.ping()
        # The bound, plus the event loop's turn on a loaded machine.
        assert time.monotonic() - started < 0.5 + 1.0
        proxy.set_latency(0)
        # The next ping does not queue behind the one given up on, whose replies the proxy still
        # holds back for minutes: only a new connection can answer it.
        await pinger.ping()
    finally:
        proxy.drop_all()
        await pinger.close()


async def test_a_connection_ended_while_idle_is_not_a_false_not_ready(db_url: str, proxy: Proxy) -> None:
    """A server restart, idle_session_timeout or a dropped link ends the idle connection between
    two probes: the server is fine, and the ping asks it on a new connection."""
    pinger = Pinger(proxy.url_for(db_url), {"autocommit": True})
    try:
        await pinger.ping()
        assert proxy.drop_all() == 1
        await pinger.ping()
        assert proxy.accepted == 2
    finally:
        await pinger.close()


async def test_concurrent_pings_share_one_connection(db_url: str, proxy: Proxy) -> None:
    pinger = Pinger(proxy.url_for(db_url), {"autocommit": True})
    try:
        await asyncio.gather(*(pinger.ping() for _ in range(10)))
        await asyncio.gather(*(pinger.ping() for _ in range(10)))
        assert proxy.accepted == 1
    finally:
        await pinger.close()
