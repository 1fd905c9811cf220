"""The replica's pool reconnects within about a second of Postgres coming back, however long it was
away (adapters/postgres/db.py, Refill).

psycopg_pool on its own retries a lost connection with a delay that doubles (1, 2, 4, 8 s ...):
after an 8 s outage its next attempt comes 6 to 9 s after the server is back, and under Patroni
(whose leader ttl is 20 s at least) the replicas sat out 8.6 s after the new primary was writable
(tests/chaos/test_patroni.py). Here the server is cut off (a proxy refusing, every open connection
dropped) for OUTAGE_S, then let through again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool

from tests.chaos.proxy import Proxy
from tests.helpers import until
from worker.adapters.postgres import db

OUTAGE_S = 8.0  # past three doublings: psycopg_pool's own next try would come at 15 s
BACK_WITHIN_S = 3.0  # RECONNECT_S, a connection's set-up, and a loaded machine's slack


@pytest.fixture
async def pool(db_url: str, proxy: Proxy) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool = db.pool(
        proxy.url_for(db_url), "reconnect-test", min_size=2, max_size=4, idle_in_transaction_ms=60_000
    )
    await pool.open(wait=True, timeout=10)
    yield pool
    await pool.close()


def available(pool: AsyncConnectionPool[Any]) -> bool:
    return bool(pool.get_stats().get("pool_available", 0))


async def test_the_pool_reconnects_within_a_second_of_the_server_coming_back(
    pool: AsyncConnectionPool[Any], proxy: Proxy
) -> None:
    proxy.refuse(True)
    proxy.drop_all()
    await pool.check()  # the pool finds its connections broken and starts replacing them
    assert not available(pool)
    await until(lambda: pool.get_stats().get("connections_errors", 0) >= 2, what="reconnect attempts failing")
    await asyncio.sleep(
        OUTAGE_S
    )  # the outage itself: the server stays away this long, whatever the pool does
    proxy.refuse(False)
    back = time.monotonic()
    await until(lambda: available(pool), timeout=30, what="a connection in the pool again", interval=0.02)
    took = time.monotonic() - back
    assert took < BACK_WITHIN_S, f"the pool reconnected {took:.1f}s after the server came back"
    async with pool.connection(timeout=5) as conn:
        await conn.execute("SELECT 1")
