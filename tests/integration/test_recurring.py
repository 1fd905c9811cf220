"""Recurring timers end to end (issue 6), on real Postgres and NATS with an in-process replica."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta
from itertools import pairwise

import nats

from tests.helpers import (
    QUICK_DOWNTIME,
    epoch,
    iso_in,
    jetstream,
    publish_raw,
    query,
    recorder,
    row,
    running_replica,
    until,
)
from tests.twins import claim_params
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.client import TimerClient
from worker.config import Settings
from worker.devkit.recorder import EventRecorder


async def test_times_three_fires_three_distinct_occurrences_then_reaches(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        first = iso_in(0.3, db_url)
        body = {
            "tenantId": "acme",
            "serviceCallId": "rep",
            "dueAt": first,
            "repeat": {"every": "PT1S", "times": 3},
        }
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(
            lambda: (r := row(db_url, "acme", "rep")) is not None and r["state"] == "Reached",
            timeout=15,
            what="third occurrence fired",
        )
        await until(lambda: rec.keys()[("acme", "rep")] >= 3, timeout=5, what="three events seen")
    firings = sorted(rec.firings, key=lambda f: f.due_at)
    assert len(firings) == 3
    assert len({f.msg_id for f in firings}) == 3
    # Occurrences count from the anchor (dueAt at millisecond precision), one period apart.
    assert abs(firings[0].due_at - epoch(first)) < 0.002
    assert [round(b.due_at - a.due_at, 3) for a, b in pairwise(firings)] == [1.0, 1.0]


async def test_forever_timer_stays_scheduled_and_moves_forward(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        first = iso_in(0.2, db_url)
        body = {"tenantId": "acme", "serviceCallId": "tick", "dueAt": first, "repeat": {"every": "PT1S"}}
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: rec.keys()[("acme", "tick")] >= 1, timeout=10, what="first occurrence")
        await until(
            lambda: (r := row(db_url, "acme", "tick")) is not None and r["due_at"].timestamp() > epoch(first),
            what="dueAt moved forward",
        )
        r = row(db_url, "acme", "tick")
        assert r is not None and r["state"] == "Scheduled"
        assert r["fired_count"] >= 1


async def test_cancel_stops_the_occurrences_not_yet_claimed(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        body = {
            "tenantId": "acme",
            "serviceCallId": "rep",
            "dueAt": iso_in(0.2, db_url),
            "repeat": {"every": "PT1S"},
        }
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: rec.keys()[("acme", "rep")] >= 2, what="two occurrences")
        # The cancel may meet a claimed occurrence: that one fires, and the cancel applies after it.
        await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": "rep"})
        await until(lambda: (row(db_url, "acme", "rep") or {}).get("state") == "Cancelled", what="cancelled")
        cancelled = row(db_url, "acme", "rep")
        assert cancelled is not None
        # Three more periods pass with the replica running; a marker due after them proves it.
        marker = {"tenantId": "acme", "serviceCallId": "marker", "dueAt": iso_in(3, db_url)}
        await publish_raw(js, settings, "acme", "schedule", marker)
        await until(lambda: rec.keys()[("acme", "marker")] == 1, what="marker fired")
    fired = [f for f in rec.firings if f.service_call_id == "rep"]
    assert len(fired) == cancelled["fired_count"] >= 2
    assert len({f.msg_id for f in fired}) == len(fired)
    # Nothing due after the cancel was applied fired.
    assert max(f.due_at for f in fired) <= cancelled["updated_at"].timestamp()
    assert (row(db_url, "acme", "rep") or {}).get("state") == "Cancelled"


async def test_after_downtime_a_recurring_timer_fires_once_for_the_missed_window(
    settings: Settings, db_url: str
) -> None:
    """The rule (worker/core/recurrence.py next_occurrence): the occurrence that was due fires, late;
    the next is the first one due strictly after that firing's claim; those in between are skipped
    and still consume their indexes."""
    async with contextlib.AsyncExitStack() as outer:
        async with running_replica(settings), jetstream(settings) as js:  # creates the streams
            rec = await outer.enter_async_context(recorder(settings))  # outlives this replica
            body = {
                "tenantId": "acme",
                "serviceCallId": "rep",
                "dueAt": iso_in(0.2, db_url),
                "repeat": {"every": "PT1S"},
            }
            await publish_raw(js, settings, "acme", "schedule", body)
            await until(lambda: rec.keys()[("acme", "rep")] >= 1, what="first occurrence")
        # No replica runs while at least three occurrences come due.
        stopped = row(db_url, "acme", "rep")
        assert stopped is not None and stopped["state"] == "Scheduled"
        missed_until = stopped["due_at"] + timedelta(seconds=2.5)
        await until(lambda: query(db_url, "SELECT now() > %s", missed_until) == [(True,)], what="downtime")
        on_time = len(rec.firings)
        async with running_replica(settings, **QUICK_DOWNTIME):
            await until(lambda: len(rec.firings) >= on_time + 3, timeout=15, what="catch-up and two more")
    anchor = epoch(body["dueAt"])
    after = sorted(rec.firings[on_time:], key=lambda f: f.due_at)
    index = [round(f.due_at - anchor) for f in after]
    late = after[0]
    # Exactly one firing for the missed window: the occurrence the row held when replicas died...
    assert abs(late.due_at - stopped["due_at"].timestamp()) < 0.002
    assert late.received_at - late.due_at > 2.4
    # ...then on schedule again: the next occurrence after the catch-up, one period apart.
    assert index[1] - index[0] >= 3, f"missed occurrences fired: {index}"
    assert [b - a for a, b in pairwise(index[1:])] == [1] * (len(index) - 2)
    # The first occurrence due after the catch-up's claim (made just before it was received).
    assert late.received_at - 1.0 < after[1].due_at <= late.received_at + 1.0
    assert len({f.msg_id for f in rec.firings}) == len(rec.firings)


async def _claimed_by_a_replica_that_dies(db_url: str, lease_ms: int) -> None:
    """A PT1S timer due now, claimed under a lease by a replica that never fires it: stopped
    mid-batch, its claim committed unrecorded (a crash rolls the claim back instead, and then no
    lease hides the timer at all)."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " VALUES ('acme', 'tick', 'Scheduled', now(), now(), 'PT1S')",
    )
    async with db.pool(db_url, "tests", min_size=1, max_size=1, idle_in_transaction_ms=lease_ms) as pool:
        batch = await Store(pool).claim(claim_params("crashed", 10, 0, lease_ms=lease_ms))
        await batch.close()
    assert [c.service_call_id for c in batch.result.claimed] == ["tick"]


def _indexes(rec: EventRecorder, db_url: str) -> list[int]:
    anchor = query(db_url, "SELECT anchor_due_at FROM timers WHERE service_call_id = 'tick'")[0][0]
    return sorted(round(f.due_at - anchor.timestamp()) for f in rec.firings)


async def test_a_crash_skips_no_occurrence_of_a_period_shorter_than_half_the_lease(
    settings: Settings, db_url: str
) -> None:
    """The crashed claim hides occurrence 0 for a whole lease (3 s): occurrences 1 and 2 come due
    meanwhile, and 3 before the re-claim (a poll interval later, at worst). A crash is not
    downtime: every one of them fires, late and in order, then the timer is on time again."""
    assert settings.lease_ms > 2 * 1000
    async with contextlib.AsyncExitStack() as outer:
        async with running_replica(settings):  # creates the streams
            rec = await outer.enter_async_context(recorder(settings))
        await _claimed_by_a_replica_that_dies(db_url, settings.lease_ms)
        async with running_replica(settings):
            await until(lambda: len(rec.firings) >= 8, timeout=20, what="eight occurrences")
    indexes = _indexes(rec, db_url)
    assert indexes == list(range(len(indexes))), f"skipped: {sorted(set(range(indexes[-1])) - set(indexes))}"
    first = min(rec.firings, key=lambda f: f.due_at)
    assert first.received_at - first.due_at > settings.lease_ms / 1000 - 0.2  # it did wait out the lease
    assert len({f.msg_id for f in rec.firings}) == len(rec.firings)


async def test_a_crash_followed_by_downtime_fires_once_for_the_missed_window(
    settings: Settings, db_url: str
) -> None:
    """A crashed claim's lease runs out and nobody claims the timer for longer than a lease plus a
    poll interval: that is downtime, and the downtime rule applies (one late firing, then on
    schedule from the re-claim)."""
    async with contextlib.AsyncExitStack() as outer:
        async with running_replica(settings):  # creates the streams
            rec = await outer.enter_async_context(recorder(settings))
        await _claimed_by_a_replica_that_dies(db_url, QUICK_DOWNTIME["lease_ms"])
        downtime = "lease_expires_at + interval '2.5 s'"  # 1.3 s, and more
        await until(
            lambda: query(db_url, f"SELECT now() > {downtime} FROM timers")[0][0], timeout=10, what="downtime"
        )
        async with running_replica(settings, **QUICK_DOWNTIME):
            await until(lambda: len(rec.firings) >= 4, timeout=15, what="catch-up and three more")
    index = _indexes(rec, db_url)
    assert index[0] == 0
    assert index[1] >= 4, f"missed occurrences fired: {index}"  # 1 to 3 came due in the downtime
    assert [b - a for a, b in pairwise(index[1:])] == [1] * (len(index) - 2)
    assert len({f.msg_id for f in rec.firings}) == len(rec.firings)


# --- cron schedules and data (issue 23) ----------------------------------------------------------


async def test_a_cron_timer_with_data_fires_through_nats_and_counts_the_minutes_it_started_behind(
    settings: Settings, db_url: str
) -> None:
    """A minutely cron schedule that started 150 s ago: its first occurrence (the first minute at
    or after dueAt) fires at once, with its data; then it is downtime's rule (no replica claimed
    it for longer than TIMER_DOWNTIME_AFTER): the next is the first minute after the claim, and the
    minutes skipped in between took their indexes."""
    data = {"room": "blue", "attendees": ["ana", "bo"], "n": 1.5}
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        start = iso_in(-150, db_url)
        body = {
            "tenantId": "acme",
            "serviceCallId": "cron",
            "dueAt": start,
            "repeat": {"cron": "* * * * *", "times": 100},
            "data": data,
        }
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: rec.keys()[("acme", "cron")] >= 1, what="first cron occurrence")
        await until(lambda: (row(db_url, "acme", "cron") or {}).get("fired_count") == 1, what="recorded")
        due = f"{settings.subject_prefix}.acme.timer.due"
        sub = await js.pull_subscribe(due, stream=settings.event_stream)
        (msg,) = await sub.fetch(1, timeout=5)
    event = json.loads(msg.data)
    first = datetime.fromisoformat(start).replace(second=0, microsecond=0) + timedelta(minutes=1)
    assert event["payload"]["dueAt"] == first.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    assert event["data"] == data
    stored = row(db_url, "acme", "cron")
    assert stored is not None and stored["state"] == "Scheduled"
    assert (stored["repeat_cron"], stored["repeat_every"], stored["repeat_times"]) == ("* * * * *", None, 100)
    assert stored["data"] == data
    assert stored["anchor_due_at"] == first
    # Every minute from the first to the next one due took an index.
    assert stored["due_at"].second == 0 and stored["due_at"] > first
    assert stored["occurrence_index"] == round((stored["due_at"] - first).total_seconds() / 60)


async def test_the_get_reply_shows_cron_until_and_data(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), jetstream(settings) as js:
        body = {
            "tenantId": "acme",
            "serviceCallId": "standup",
            "dueAt": "2027-01-01T00:00:00Z",
            "repeat": {
                "cron": "0 9 * * MON-FRI",
                "timezone": "Europe/Paris",
                "until": "2027-12-31T23:59:00Z",
            },
            "data": {"room": "blue"},
        }
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: row(db_url, "acme", "standup") is not None, what="stored")
        nc = await nats.connect(settings.nats_url)
        async with TimerClient(nc, settings.subject_prefix, owns_connection=True) as client:
            view = await client.get("acme", "standup")
    assert view is not None
    assert view["dueAt"] == "2027-01-01T08:00:00.000Z"  # Friday 09:00 CET: the first match after dueAt
    assert view["repeat"] == {
        "every": None,
        "cron": "0 9 * * MON-FRI",
        "times": None,
        "until": "2027-12-31T23:59:00.000Z",
        "timezone": "Europe/Paris",
    }
    assert view["data"] == {"room": "blue"}
