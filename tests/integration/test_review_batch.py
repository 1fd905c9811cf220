"""Review of "one transaction per claim batch": each test here failed on main when it was written
(branch review-batch); see the commit that added it for the defect it shows."""

from __future__ import annotations

from typing import Any

from tests.chaos.proxy import Proxy
from tests.helpers import iso_in, query, running_replica, until
from worker.config import Settings


async def test_a_batch_whose_every_publish_beats_the_publish_timeout_is_recorded(
    settings: Settings, db_url: str
) -> None:
    """The publish timeout is held below the lease (Settings) so that a batch's session is idle in
    its transaction for less than the lease (adapters/db.py). But a batch publishes its first
    attempts and its retries in two calls, one after the other, each given the whole timeout: on
    a slow NATS (every PubAck within the timeout) the session outlives the lease, Postgres ends it,
    and the claim rolls back, attempts included, so the next claim has the same shape again."""
    lease_ms, publish_timeout_ms, one_way_s = 1000, 900, 0.3  # a PubAck in ~0.6 s: well within the timeout
    host, port = settings.nats_url.removeprefix("nats://").split(":")
    with Proxy(host, int(port)) as proxy:
        slow: dict[str, Any] = {
            "nats_url": proxy.url_for(settings.nats_url),
            "lease_ms": lease_ms,
            "publish_timeout_ms": publish_timeout_ms,
        }
        async with running_replica(settings, **slow):
            proxy.set_latency(one_way_s)
            # One statement, so one claim takes both: a first attempt, and a retry whose previous
            # claim's lease (a stop) ran out.
            query(
                db_url,
                "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, attempts,"
                " lease_owner, lease_token, lease_expires_at)"
                " VALUES ('acme', 'first', 'Scheduled', %s, %s, 0, NULL, NULL, NULL),"
                " ('acme', 'retry', 'Scheduled', %s, %s, 1, 'gone', 1, now() - interval '1 s')",
                *[iso_in(-1, db_url)] * 4,
            )
            await until(
                lambda: query(db_url, "SELECT count(*) FROM timers WHERE state = 'Reached'") == [(2,)],
                timeout=30,
                what="both timers recorded Reached (every publish acknowledged within the timeout)",
            )
