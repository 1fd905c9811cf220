"""A due timer that a claim skipped because an intake transaction held its row fires as soon as
that transaction commits, not a poll interval later (Intake._hint; sql/queries.sql, held_among)."""

from __future__ import annotations

import time

import psycopg
from prometheus_client import REGISTRY

from tests.helpers import iso_in, jetstream, publish_raw, query, running_replica, until
from worker.adapters.broker import Broker
from worker.config import Settings


def claims() -> float:
    return REGISTRY.get_sample_value("timer_claim_seconds_count") or 0.0


def intake_waits_on_a_lock(db_url: str) -> bool:
    """Someone waits for a row lock in this test's database: only intake writes to it here."""
    return query(
        db_url,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'",
    ) != [(0,)]


async def test_a_due_row_skipped_while_intake_held_it_fires_once_intake_commits(
    settings: Settings, db_url: str
) -> None:
    # A poll interval nothing can be mistaken for: without a wake-up the row waits all of it.
    slow = settings.model_copy(update={"poll_interval_ms": 30_000})
    # k comes due in a few seconds; l is what keeps intake's transaction open meanwhile.
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, command_ts)"
        " VALUES ('acme', 'k', 'Scheduled', now() + interval '4 seconds', now() + interval '4 seconds', 100),"
        "        ('acme', 'l', 'Scheduled', now() + interval '1 day', now() + interval '1 day', 100)",
    )
    ((k_due,),) = query(db_url, "SELECT due_at FROM timers WHERE service_call_id = 'k'")
    blocker = psycopg.connect(db_url)  # a transaction holding l's row, as another replica's batch would
    try:
        blocker.execute("SELECT 1 FROM timers WHERE service_call_id = 'l' FOR UPDATE")
        broker = Broker(slow)  # the streams, before any replica runs: the batch waits in them
        await broker.connect()
        await broker.ensure_streams()
        await broker.close()
        async with jetstream(slow) as js:
            # One batch: an older ScheduleTimer for k (ignored: its row is locked, not changed),
            # then one for l, which waits for the blocker while the batch holds k.
            for key, ts in (("k", 50), ("l", 200)):
                body = {
                    "tenantId": "acme",
                    "serviceCallId": key,
                    "dueAt": iso_in(86_400),
                    "timestampMs": ts,
                }
                await publish_raw(js, slow, "acme", "schedule", body)
        started = claims()
        async with running_replica(slow):
            await until(lambda: claims() > started, what="the first claim")
            await until(lambda: intake_waits_on_a_lock(db_url), what="intake waiting for l, holding k")
            held_since = claims()
            ((early,),) = query(db_url, "SELECT now() < %s - interval '1 second'", k_due)
            assert early, "setup too slow: k came due before intake held it; nothing was tested"
            # The firing loop wakes for k (the first claim's next dueAt) and skips it: it is locked.
            await until(lambda: claims() > held_since, what="a claim once k came due")
            assert query(
                db_url, "SELECT lease_owner, fired_count FROM timers WHERE service_call_id = 'k'"
            ) == [(None, 0)], "k was claimed: intake did not hold it, nothing was tested"
            blocker.commit()
            committed = time.monotonic()
            await until(
                lambda: query(db_url, "SELECT fired_count FROM timers WHERE service_call_id = 'k'") == [(1,)],
                timeout=10,
                what="k fired well before the 30 s poll",
            )
            assert time.monotonic() - committed < 10
    finally:
        blocker.close()
