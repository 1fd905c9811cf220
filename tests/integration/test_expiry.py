"""Expiry end to end (docs/USING.md, Expiry), on real Postgres and NATS: with every replica stopped past
its due time and its expireAfter, an occurrence is not fired but goes to the DLQ (reason expired,
how late), a one-shot ends Expired, a recurring timer goes on, and one still within its expiry
fires late as before; `dlq replay` refuses an expired occurrence's entry."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from prometheus_client import REGISTRY

from tests.helpers import (
    consumer_idle,
    iso_in,
    jetstream,
    publish_raw,
    query,
    row,
    running_replica,
    settings_env,
    until,
)
from tests.integration.ops.test_cli import run
from worker.adapters.postgres.store import Store
from worker.client import TimerClient
from worker.config import Settings
from worker.core.retention import Retention


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _db_now(db_url: str) -> datetime:
    ((now,),) = query(db_url, "SELECT now()")
    return now  # type: ignore[no-any-return]


async def test_occurrences_past_their_expiry_after_an_outage_go_to_the_dlq_unfired(
    settings: Settings, db_url: str, client: TimerClient
) -> None:
    due = iso_in(3, db_url)
    bodies = {
        "once": {"expireAfter": "PT1S"},
        "hourly": {"expireAfter": "PT1S", "repeat": {"every": "PT1H"}},
        "patient": {"expireAfter": "PT1H"},
    }
    async with running_replica(settings), jetstream(settings) as js:
        for key, extra in bodies.items():
            body = {"tenantId": "acme", "serviceCallId": key, "dueAt": due, **extra}
            await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: all(row(db_url, "acme", k) is not None for k in bodies), what="all three stored")
    # No replica runs: the database clock passes the due time and the one-second expiry.
    await until(lambda: _db_now(db_url) > _at(due) + timedelta(seconds=2), timeout=10, what="expiry passed")
    before = REGISTRY.get_sample_value("timer_expired_total") or 0.0
    async with running_replica(settings), jetstream(settings) as js:
        await until(
            lambda: (r := row(db_url, "acme", "once")) is not None and r["state"] == "Expired",
            what="the one-shot recorded Expired",
        )
        await until(
            lambda: (r := row(db_url, "acme", "patient")) is not None and r["state"] == "Reached",
            what="the patient one fired",
        )
        dlq = await js.pull_subscribe(f"{settings.subject_prefix}.acme.timer.dlq", stream=settings.dlq_stream)
        entries = await dlq.fetch(2, timeout=10)
        view = await client.get("acme", "once")
        due_sub = f"{settings.subject_prefix}.acme.timer.due"
        events = (await js.stream_info(settings.event_stream, subjects_filter=due_sub)).state.subjects or {}
    # The DLQ says which occurrences, how late, and why; nothing of them reached the consumers.
    by_key = {json.loads(e.data)["serviceCallId"]: e for e in entries}
    assert set(by_key) == {"once", "hourly"}
    for key, entry in by_key.items():
        body = json.loads(entry.data)
        assert entry.headers is not None and entry.headers["Timer-Error"] == "expired"
        assert entry.headers["Timer-Subject"] == due_sub
        assert (
            body["type"] == "ExpiredOccurrence"
            and body["tenantId"] == "acme"
            and body["expireAfter"] == "PT1S"
        )
        assert _at(body["dueAt"]).replace(microsecond=0) == _at(due).replace(microsecond=0)
        assert body["lateMs"] > 1000, (key, body)
    assert events.get(due_sub) == 1  # the patient one's event only
    # The one-shot ended Expired, never fired; the recurring one moved on to its next occurrence.
    assert view is not None and view["state"] == "Expired" and view["occurrencesFired"] == 0
    assert view["expireAfter"] == "PT1S" and view["reachedAt"] is None
    hourly = row(db_url, "acme", "hourly")
    assert hourly is not None and hourly["state"] == "Scheduled" and hourly["fired_count"] == 0
    assert hourly["due_at"] == _at(due) + timedelta(hours=1)
    assert (REGISTRY.get_sample_value("timer_expired_total") or 0.0) - before == 2
    # No command to send again: `dlq replay` refuses in one line, and the entry stays.
    seq = by_key["once"].metadata.sequence.stream
    refused = run("dlq", "replay", str(seq), **settings_env(settings))
    assert refused.returncode == 2 and refused.stderr.strip() == (
        f"timer-service: not replayed: entry {seq} is an occurrence that expired unfired "
        "(ExpiredOccurrence), not a command: there is nothing to replay; schedule the timer again "
        "to have it fire"
    )
    assert run("dlq", "show", str(seq), **settings_env(settings)).returncode == 0


async def test_an_expired_timer_is_final_like_a_reached_one(settings: Settings, db_url: str) -> None:
    due = iso_in(-5, db_url)  # past its expiry already when first claimed
    body = {"tenantId": "acme", "serviceCallId": "late", "dueAt": due, "expireAfter": "PT1S"}
    async with running_replica(settings), jetstream(settings) as js:
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(
            lambda: (r := row(db_url, "acme", "late")) is not None and r["state"] == "Expired", what="expired"
        )
        # A later ScheduleTimer of the key is acknowledged and ignored, as on a Reached timer.
        again = {**body, "dueAt": iso_in(3600, db_url)}
        await publish_raw(js, settings, "acme", "schedule", again)
        await until(lambda: consumer_idle(settings), what="the second command handled")
    r = row(db_url, "acme", "late")
    assert r is not None and r["state"] == "Expired" and r["anchor_due_at"] == _at(due)


async def test_a_sweep_deletes_the_expiry_decisions_of_occurrences_no_timer_holds_any_more(
    db_url: str, store: Store
) -> None:
    """Kept while the row still holds the occurrence pending (a re-claim may come), with a window
    by its dueAt; gone once the row moved on, finished, or is no more."""
    query(
        db_url,
        """INSERT INTO timers (tenant_id, service_call_id, state, due_at, nominal_due_at)
           VALUES ('acme', 'held', 'Scheduled', '2030-01-01T00:00Z', NULL),
                  ('acme', 'paused', 'Paused', '2030-01-01T00:00Z', NULL),
                  ('acme', 'windowed', 'Scheduled', '2030-01-01T00:05Z', '2030-01-01T00:00Z'),
                  ('acme', 'moved', 'Scheduled', '2030-01-01T01:00Z', NULL),
                  ('acme', 'reached', 'Reached', '2030-01-01T00:00Z', NULL)""",
    )
    query(
        db_url,
        """INSERT INTO timer_expiry (tenant_id, service_call_id, due_at, expired)
           SELECT 'acme', k, '2030-01-01T00:00Z', false
           FROM unnest(ARRAY['held', 'paused', 'windowed', 'moved', 'reached', 'deleted']) AS k""",
    )
    assert await Retention(store, timedelta(days=7), batch=2).sweep() == 0  # no finished row is old
    kept = query(db_url, "SELECT service_call_id FROM timer_expiry ORDER BY 1")
    assert kept == [("held",), ("paused",), ("windowed",)]
