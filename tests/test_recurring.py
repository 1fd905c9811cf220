"""Recurring timers end to end (issue 6), on real Postgres and NATS with an in-process replica."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise

from tests.helpers import iso_in, jetstream, publish_raw, recorder, row, running_replica, until
from worker.config import Settings


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


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
    assert abs(firings[0].due_at - _epoch(first)) < 0.002
    assert [round(b.due_at - a.due_at, 3) for a, b in pairwise(firings)] == [1.0, 1.0]


async def test_forever_timer_stays_scheduled_and_moves_forward(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        first = iso_in(0.2, db_url)
        body = {"tenantId": "acme", "serviceCallId": "tick", "dueAt": first, "repeat": {"every": "PT1S"}}
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: rec.keys()[("acme", "tick")] >= 1, timeout=10, what="first occurrence")
        await until(
            lambda: (
                (r := row(db_url, "acme", "tick")) is not None and r["due_at"].timestamp() > _epoch(first)
            ),
            what="dueAt moved forward",
        )
        r = row(db_url, "acme", "tick")
        assert r is not None and r["state"] == "Scheduled"
        assert r["fired_count"] >= 1
