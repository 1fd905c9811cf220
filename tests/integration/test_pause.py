"""Pause and resume (docs/USING.md, Pause and resume; issue 23), end to end on real Postgres and JetStream
with in-process replicas and a recorder counting DueTimeReached events per key.

TIMER_PAUSE_SCALE sets the size of the big tenant (20,000 in `make test`; the issue's 100,000 by hand
or under chaos-soak: `TIMER_PAUSE_SCALE=100000 pytest tests/integration/test_pause.py`)."""

from __future__ import annotations

import os

from nats.js import api

from tests.helpers import (
    consumer_idle,
    iso_in,
    jetstream,
    publish_raw,
    query,
    recorder,
    row,
    running_replica,
    until,
    while_progressing,
)
from worker.config import Settings
from worker.devkit.recorder import EventRecorder
from worker.ops.reads import connect, describe, fleet_counts, render_overview, tenant_summary

SCALE = int(os.environ.get("TIMER_PAUSE_SCALE", "20000"))


def _big_tenant(db_url: str, tenant: str, n: int, due_s_ago: int) -> None:
    """n one-shot timers of `tenant`, all overdue, written as the upsert writes them (no replica
    runs yet: they must not fire before the pause is in the stream)."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
        " SELECT %s, 'sc-' || lpad(g::text, 7, '0'), 'Scheduled',"
        "        now() - make_interval(secs => %s) + g * interval '1 millisecond',"
        "        now() - make_interval(secs => %s) + g * interval '1 millisecond'"
        " FROM generate_series(1, %s) g",
        tenant,
        due_s_ago,
        due_s_ago,
        n,
    )


def fleet_now_empty() -> dict[str, object]:
    return {"overdue": 0, "oldest_overdue_s": None, "backing_off": 0, "leases": []}


def _count(db_url: str, sql: str, *params: object) -> int:
    return int(query(db_url, sql, *params)[0][0])


def _fired(rec: EventRecorder, tenant: str) -> int:
    """How many of the tenant's timers fired at least once."""
    return sum(1 for k in rec.keys() if k[0] == tenant)  # noqa: SIM118


def _pause_done(db_url: str, tenant: str) -> bool:
    """The tenant is paused and none of its timers is Scheduled any more (claimed ones fired)."""
    return _count(db_url, "SELECT count(*) FROM paused_tenants WHERE tenant_id = %s", tenant) == 1 and (
        _count(db_url, "SELECT count(*) FROM timers WHERE tenant_id = %s AND state = 'Scheduled'", tenant)
        == 0
    )


async def test_pausing_a_tenant_with_due_timers_and_resuming_it_loses_none_and_fires_none_twice(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings):
        pass  # makes the streams, and goes: no replica runs while the backlog is written
    _big_tenant(db_url, "big", SCALE, due_s_ago=600)
    async with recorder(settings) as rec, jetstream(settings) as js:
        # In the stream before any replica runs: the replicas start draining the backlog and take
        # the pause side by side, as a pause arriving in the middle of a drain would be.
        await publish_raw(js, settings, "big", "pause", {"tenantId": "big"})
        async with running_replica(settings), running_replica(settings):
            await until(lambda: _pause_done(db_url, "big"), timeout=120, what="the pause moved every row")
            reached = _count(
                db_url, "SELECT count(*) FROM timers WHERE tenant_id = 'big' AND state = 'Reached'"
            )
            paused = _count(
                db_url, "SELECT count(*) FROM timers WHERE tenant_id = 'big' AND state = 'Paused'"
            )
            assert (
                reached + paused == SCALE
            )  # every timer either fired (claimed before the pause) or is paused
            assert paused > 0
            # The recorder's pace is the machine's: waited on while it moves, not for a fixed time.
            await while_progressing(lambda: _fired(rec, "big"), reached, what="the recorder catching up")
            # Another tenant's timer, due after every paused one: the claim (oldest first) has
            # passed over the paused rows once it fired, so none of them is claimable.
            await publish_raw(
                js, settings, "other", "schedule",
                {"tenantId": "other", "serviceCallId": "marker", "dueAt": iso_in(0, db_url)},
            )  # fmt: skip
            await until(lambda: rec.keys()[("other", "marker")] == 1, what="the other tenant's timer fired")
            assert _fired(rec, "big") == reached  # nothing fired while paused
            assert (row(db_url, "big", "sc-0000001") or {})["state"] in ("Paused", "Reached")

            await publish_raw(js, settings, "big", "resume", {"tenantId": "big"})
            await while_progressing(
                lambda: _fired(rec, "big"), SCALE, what="every paused timer firing after the resume"
            )
            await until(lambda: consumer_idle(settings), what="command stream drained")
            await until(
                lambda: (
                    _count(
                        db_url, "SELECT count(*) FROM timers WHERE tenant_id = 'big' AND state = 'Reached'"
                    )
                    == SCALE
                ),
                what="every firing recorded",
            )
    counts = rec.keys()
    twice = [k for k, n in counts.items() if k[0] == "big" and n != 1]
    assert twice == []  # none fired twice
    assert query(db_url, "SELECT count(*) FROM paused_tenants WHERE paused_at IS NOT NULL") == [(0,)]


async def test_a_recurring_timer_paused_across_occurrences_fires_once_for_the_missed_window(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        body = {
            "tenantId": "acme",
            "serviceCallId": "tick",
            "dueAt": iso_in(3600, db_url),
            "repeat": {"every": "PT1M"},
        }
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: row(db_url, "acme", "tick") is not None)
        await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme", "serviceCallId": "tick"})
        await until(lambda: (row(db_url, "acme", "tick") or {}).get("state") == "Paused", what="paused")
        # An hour passes while it is paused: 60 occurrences come due (the schedule moved back).
        query(
            db_url,
            "UPDATE timers SET due_at = due_at - interval '2 hours',"
            " anchor_due_at = anchor_due_at - interval '2 hours' WHERE tenant_id = 'acme'",
        )
        await publish_raw(js, settings, "acme", "resume", {"tenantId": "acme", "serviceCallId": "tick"})
        await until(lambda: rec.keys()[("acme", "tick")] >= 1, what="the missed window fired")
        await until(lambda: (row(db_url, "acme", "tick") or {}).get("fired_count") == 1, what="recorded")
        after = row(db_url, "acme", "tick") or {}
        (now,) = query(db_url, "SELECT now()")[0]
    # The downtime rule: one firing for the missed window, the next occurrence in the future.
    assert rec.keys()[("acme", "tick")] == 1
    assert after["state"] == "Scheduled" and after["due_at"] > now and after["paused_at"] is None


async def test_a_timer_paused_by_itself_stays_paused_when_its_tenant_resumes(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        for sc in ("one", "two"):
            await publish_raw(
                js,
                settings,
                "acme",
                "schedule",
                {"tenantId": "acme", "serviceCallId": sc, "dueAt": iso_in(3600, db_url)},
            )
        await until(lambda: row(db_url, "acme", "two") is not None)
        await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme", "serviceCallId": "one"})
        await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme"})
        await until(lambda: _pause_done(db_url, "acme"), what="tenant paused")
        await until(
            lambda: (row(db_url, "acme", "one") or {}).get("paused_at") is not None, what="one paused"
        )
        # A new timer of a paused tenant is stored paused; a rescheduled one stays paused.
        await publish_raw(
            js,
            settings,
            "acme",
            "schedule",
            {"tenantId": "acme", "serviceCallId": "new", "dueAt": iso_in(0, db_url)},
        )
        await until(
            lambda: (row(db_url, "acme", "new") or {}).get("state") == "Paused", what="new stored paused"
        )
        query(db_url, "UPDATE timers SET due_at = now() - interval '1 second' WHERE tenant_id = 'acme'")
        await publish_raw(js, settings, "acme", "resume", {"tenantId": "acme"})
        await until(
            lambda: rec.keys()[("acme", "two")] == 1 and rec.keys()[("acme", "new")] == 1, what="resumed"
        )
        await until(lambda: consumer_idle(settings), what="command stream drained")
        assert (row(db_url, "acme", "one") or {})["state"] == "Paused"
        assert rec.keys()[("acme", "one")] == 0
        # describe and status show it; the contract says Scheduled, paused.
        with connect(db_url) as conn:
            view = describe(conn, "acme", "one") or {}
            counts = fleet_counts(conn)
            summary = tenant_summary(conn, "acme")
        assert (view["state"], view["paused"]) == ("Scheduled", True)
        assert view["pausedAt"] is not None and view["why"].startswith("paused by itself")
        assert counts["paused"] == 1 and counts["paused_tenants"][0]["tenant"] == "acme"
        assert "acme: 1 timers" in render_overview({**counts, **fleet_now_empty()})
        assert summary["paused"] == 1 and summary["tenant_paused_at"] is None
        await publish_raw(js, settings, "acme", "resume", {"tenantId": "acme", "serviceCallId": "one"})
        await until(lambda: rec.keys()[("acme", "one")] == 1, what="its own resume fired it")


async def test_a_tenant_cannot_pause_another_tenants_timers(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), jetstream(settings) as js:
        await publish_raw(
            js,
            settings,
            "victim",
            "schedule",
            {"tenantId": "victim", "serviceCallId": "v", "dueAt": iso_in(3600, db_url)},
        )
        await until(lambda: row(db_url, "victim", "v") is not None)
        # On its own subject, naming the victim in the body: refused, to the DLQ.
        await publish_raw(js, settings, "mallory", "pause", {"tenantId": "victim"})
        await publish_raw(
            js, settings, "mallory", "pause", {"tenantId": "mallory", "serviceCallId": "\u0000"}
        )
        await until(lambda: consumer_idle(settings), what="command stream drained")
        dlq = await js.subscribe(f"{settings.subject_prefix}.mallory.timer.dlq", stream=settings.dlq_stream)
        reasons = [(await dlq.next_msg(timeout=5)).headers["Timer-Error"] for _ in range(2)]
    assert sorted(reasons) == ["bad_service_call_id", "tenant_mismatch"]
    assert (row(db_url, "victim", "v") or {})["state"] == "Scheduled"
    assert query(db_url, "SELECT count(*) FROM paused_tenants WHERE paused_at IS NOT NULL") == [(0,)]


async def test_a_command_stream_and_consumer_made_before_pause_get_its_subjects(
    settings: Settings, db_url: str
) -> None:
    """A deployment's command stream and shared consumer were created with schedule and cancel only:
    a replica of this release adds pause and resume to both (and nothing else changes), so a pause
    is stored and delivered."""
    old = [f"{settings.subject_prefix}.*.timer.schedule", f"{settings.subject_prefix}.*.timer.cancel"]
    async with jetstream(settings) as js:
        await js.add_stream(
            api.StreamConfig(
                name=settings.command_stream,
                subjects=old,
                retention=api.RetentionPolicy.WORK_QUEUE,
                max_age=settings.command_max_age.total_seconds(),
                duplicate_window=120,
            )
        )
        await js.add_consumer(
            settings.command_stream,
            api.ConsumerConfig(
                durable_name=settings.consumer,
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=30,
                max_deliver=-1,
                filter_subjects=old,
            ),
        )
        async with running_replica(settings):
            stream = (await js.stream_info(settings.command_stream)).config
            consumer = (await js.consumer_info(settings.command_stream, settings.consumer)).config
            await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme"})
            await until(
                lambda: query(db_url, "SELECT count(*) FROM paused_tenants") == [(1,)], what="applied"
            )
    wanted = [*old, f"{settings.subject_prefix}.*.timer.pause", f"{settings.subject_prefix}.*.timer.resume"]
    # the stream binds command subjects only: the consumer takes them all, unfiltered (command_filter)
    assert stream.subjects == wanted and not consumer.filter_subjects and not consumer.filter_subject
    assert stream.max_age == settings.command_max_age.total_seconds() and stream.duplicate_window == 120


async def test_a_resume_never_brings_back_a_cancelled_or_reached_timer_an_old_replica_left_paused_at_on(
    settings: Settings, db_url: str
) -> None:
    """A replica of the release before 0011 does not know paused_at: its cancel of a timer paused by
    itself leaves it set, as does its ScheduleTimer that un-pauses one, which then fires (README,
    Upgrades). A later ResumeTimers naming such a timer must leave it Cancelled or Reached."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, paused_at)"
        " VALUES ('acme', 'cancelled', 'Cancelled', now() - interval '1 minute', now() - interval '1 minute',"
        "         now() - interval '2 minutes'),"
        "        ('acme', 'reached', 'Reached', now() - interval '1 minute', now() - interval '1 minute',"
        "         now() - interval '2 minutes')",
    )
    async with running_replica(settings), jetstream(settings) as js:
        for sid in ("cancelled", "reached"):
            await publish_raw(js, settings, "acme", "resume", {"tenantId": "acme", "serviceCallId": sid})
        await until(lambda: consumer_idle(settings), what="both resumes applied")
    assert (row(db_url, "acme", "cancelled") or {})["state"] == "Cancelled"
    assert (row(db_url, "acme", "reached") or {})["state"] == "Reached"
