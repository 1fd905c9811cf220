"""The console's lateness card (worker/ops/fleet_stats.py, lateness): what a consumer sees, PubAck
time minus dueAt, the chart's histogram over the last five minutes; not the rows' reachedAt,
which a claim records up to 100 ms ahead of dueAt."""

from __future__ import annotations

import asyncio
import re

from psycopg_pool import AsyncConnectionPool
from starlette.testclient import TestClient

from tests.helpers import query
from tests.integration.ops.test_console import _login, console_settings
from worker import metrics
from worker.adapters.postgres.stats import StatsRollup
from worker.config import Settings
from worker.ops.console.app import create_app


def _ms(text: str) -> float:
    value, unit = text.split()
    return float(value) * (1000 if unit == "s" else 1)


def test_the_lateness_card_reads_what_the_chart_draws(settings: Settings, db_url: str) -> None:
    # A timer the fleet kept up with: claimed ahead, recorded at its dueAt; its PubAck came 40 ms
    # after dueAt, and 100 firings like it are what the replica's histogram holds.
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, reached_at, fired_count) "
        "VALUES ('acme', 'kept-up', 'Reached', now() - interval '1 s', now() - interval '1 s', 1)",
    )

    async def write() -> None:
        async with AsyncConnectionPool(db_url, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
            rollup = StatsRollup(pool, "replica-a")
            for _ in range(100):
                metrics.LATENESS_SECONDS.observe(0.04)
            await rollup.write()

    asyncio.run(write())
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as client:
        _login(client)
        page = client.get("/").text
    card = re.search(r"Lateness p50 / p99 \(last 5 min, (\d+) fired\)\s*<b>([^<]*) / ([^<]*)</b>", page)
    assert card is not None, page
    chart = re.search(r"p50 (\d+ m?s), p99 (\d+ m?s)", page)
    assert chart is not None, page
    assert card.group(1) == "100", card.group(0)
    for shown, drawn in ((card.group(2), chart.group(1)), (card.group(3), chart.group(2))):
        assert abs(_ms(shown) - _ms(drawn)) <= 0.5, (card.group(0), chart.group(0))
    assert 25 < _ms(card.group(2)) <= _ms(card.group(3)) <= 50, card.group(0)
