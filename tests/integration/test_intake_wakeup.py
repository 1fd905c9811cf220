"""A due timer that a claim skipped because an intake transaction held its row fires as soon as
that transaction commits, not a poll interval later (Intake._hint; sql/queries/intake.sql, held_among).
And what comes on the wake subject from anyone but a replica cannot make the replicas claim
without end (worker/core/wakeup.py, peer hints)."""

from __future__ import annotations

import time

import psycopg
import pytest
from prometheus_client import REGISTRY

from tests.helpers import iso_in, jetstream, publish_raw, query, running_replica, until
from worker.adapters.jetstream.broker import Broker
from worker.config import Settings
from worker.contract import Subjects
from worker.core.wakeup import PEER_HINT_SPACING_S


def claims() -> float:
    return REGISTRY.get_sample_value("timer_claim_seconds_count") or 0.0


def dropped(reason: str) -> float:
    return REGISTRY.get_sample_value("timer_wake_hints_dropped_total", {"reason": reason}) or 0.0


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


@pytest.mark.parametrize("sender", ["core", "jetstream"])
async def test_a_flood_on_the_wake_subject_adds_at_most_one_claim_per_interval(
    settings: Settings, sender: str
) -> None:
    """Issue 31: a tenant's push consumer delivering its DLQ onto the wake subject took an idle
    replica from 2 claims in 5 s to about 2,500. Here the flood comes straight (as from anyone
    allowed to publish there) or as JetStream delivers (with a reply subject, which no replica's
    hint has): claims stay at most one per PEER_HINT_SPACING_S, counted while the
    flood is on, and the hints held back or refused are counted."""
    quiet = settings.model_copy(update={"poll_interval_ms": 30_000})  # no claim but the flood's
    wake = Subjects(quiet.subject_prefix).wake
    # (JetStream's deliveries carry their ack subject as reply; a client may not publish on $JS.ACK)
    reply = "_INBOX.mallory.ack" if sender == "jetstream" else ""
    reason = "foreign" if sender == "jetstream" else "limited"
    async with running_replica(quiet), jetstream(quiet) as js:
        nc = js._nc
        await until(lambda: claims() > 0, what="the first claim")
        before_dropped = dropped(reason)
        started = time.monotonic()
        window: list[tuple[float, float]] = []  # (time, claims) once the flood is under way
        sent = 0
        while (now := time.monotonic()) - started < 2.0:
            for _ in range(50):
                await nc.publish(wake, b"0", reply=reply)  # due at epoch 0: wake at once
            await nc.flush()
            sent += 50
            if now - started >= 0.5:  # hints have been arriving for a while
                window.append((now, claims()))
        (t0, c0), (t1, c1) = window[0], window[-1]
        assert sent > 1000, "a flood, not a trickle"
        assert c1 - c0 <= (t1 - t0) / PEER_HINT_SPACING_S + 2, f"{c1 - c0:.0f} claims in {t1 - t0:.1f} s"
        assert dropped(reason) - before_dropped > sent / 2
