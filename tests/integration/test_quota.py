"""Per-tenant limit on pending timers (TIMER_TENANT_MAX_PENDING, issue 6)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from tests.helpers import iso_in, jetstream, publish_raw, query, row, running_replica, until
from worker.adapters.queries import QUERIES
from worker.adapters.store import Store
from worker.config import Settings
from worker.contract import CancelTimer, Command, ScheduleTimer
from worker.core.quota import over_quota


def _ids(db_url: str, tenant: str, state: str = "Scheduled") -> set[str]:
    rows = query(
        db_url, "SELECT service_call_id FROM timers WHERE tenant_id = %s AND state = %s", tenant, state
    )
    return {sc for (sc,) in rows}


async def test_schedules_over_the_limit_go_to_the_dlq_and_reschedules_pass(
    settings: Settings, db_url: str
) -> None:
    far = iso_in(3600, db_url)
    async with running_replica(settings, tenant_max_pending=3), jetstream(settings) as js:
        dlq = await js.subscribe(f"{settings.subject_prefix}.*.timer.dlq", stream=settings.dlq_stream)
        for i in range(5):
            await publish_raw(js, settings, "acme", "schedule", _schedule("acme", f"a{i}", far))
        for i in range(2):
            await publish_raw(js, settings, "globex", "schedule", _schedule("globex", f"b{i}", far))
        rejected = [await dlq.next_msg(timeout=10) for _ in range(2)]
        await until(lambda: len(_ids(db_url, "acme")) == 3 and len(_ids(db_url, "globex")) == 2)
        assert _ids(db_url, "acme") == {"a0", "a1", "a2"}  # the first three, in stream order
        assert [m.data for m in rejected] == [_body("acme", "a3", far), _body("acme", "a4", far)]
        assert all(m.headers and m.headers["Timer-Error"] == "quota_exceeded" for m in rejected)
        assert {m.subject for m in rejected} == {f"{settings.subject_prefix}.acme.timer.dlq"}

        # At the limit, moving an existing timer is no new timer: accepted.
        soon = iso_in(1800, db_url)
        await publish_raw(js, settings, "acme", "schedule", _schedule("acme", "a0", soon))
        await until(
            lambda: (
                (r := row(db_url, "acme", "a0")) is not None and r["due_at"] < datetime.fromisoformat(far)
            ),
            what="reschedule applied",
        )
        # A cancel makes room for one more.
        await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": "a1"})
        await until(lambda: _ids(db_url, "acme", "Cancelled") == {"a1"}, what="cancel applied")
        await publish_raw(js, settings, "acme", "schedule", _schedule("acme", "a5", far))
        await until(lambda: "a5" in _ids(db_url, "acme"), what="schedule into the freed slot")
        assert _ids(db_url, "acme") == {"a0", "a2", "a5"}
    assert query(db_url, "SELECT count(*) FROM timers WHERE tenant_id = 'acme'") == [(4,)]


def test_the_batch_walk_counts_new_timers_only() -> None:
    due = datetime.now(UTC) + timedelta(hours=1)

    def sched(tenant: str, sc: str) -> ScheduleTimer:
        return ScheduleTimer(tenant, sc, due, None, None, None)

    batch: list[Command] = [
        sched("a", "x"),  # new: 1 of 2
        sched("a", "x"),  # the same key again: a reschedule
        sched("a", "done"),  # Reached: ignored by the store, never counted
        sched("a", "live"),  # Scheduled already: a reschedule
        CancelTimer("a", "live", None, None),
        sched("a", "y"),  # new: 2 of 2
        sched("a", "z"),  # new, over the limit
        sched("b", "z"),  # another tenant, its own count
    ]
    known = {("a", "done"), ("a", "live")}
    assert over_quota(batch, known, {"a": 0, "b": 1}, limit=2) == [6]
    assert over_quota(batch, known, {"a": 2, "b": 2}, limit=2) == [
        0,
        1,
        5,
        6,
        7,
    ]  # x rejected, so its copy is new too


def _body(tenant: str, sc: str, due: str) -> bytes:
    return json.dumps(_schedule(tenant, sc, due)).encode()


def _schedule(tenant: str, sc: str, due: str) -> dict[str, object]:
    return {"tenantId": tenant, "serviceCallId": sc, "dueAt": due}


PENDING = "SELECT tenant_id, count(*) FROM timers WHERE state IN ('Scheduled', 'Paused') GROUP BY tenant_id"
COUNTED = "SELECT tenant_id, sum(pending) FROM tenant_pending GROUP BY tenant_id HAVING sum(pending) <> 0"


def count_is_exact(db_url: str) -> bool:
    """The quota's count (tenant_pending) of every tenant is its pending timers, counted anew."""
    return dict(query(db_url, COUNTED)) == dict(query(db_url, PENDING))


async def test_the_pending_count_stays_exact_through_every_change_of_a_timer(
    settings: Settings, db_url: str, store: Store
) -> None:
    """Schedules, a reschedule of a cancelled timer, cancels (and a cancel before any schedule),
    firings (one-shot: Reached; recurring: still pending), a tenant's pause and resume with a new
    timer stored paused, retention and the folds: after each, the kept count is the real one."""
    far, now = iso_in(3600, db_url), iso_in(0, db_url)
    async with running_replica(settings, tenant_max_pending=100), jetstream(settings) as js:

        async def send(kind: str, tenant: str, body: dict[str, object]) -> None:
            await publish_raw(js, settings, tenant, kind, body)

        for tenant in ("acme", "globex"):
            for i in range(5):
                await send("schedule", tenant, _schedule(tenant, f"f{i}", far))
        await send("schedule", "acme", _schedule("acme", "once", now))
        await send("schedule", "acme", {**_schedule("acme", "tick", now), "repeat": {"every": "PT1H"}})
        await until(lambda: (row(db_url, "acme", "once") or {}).get("state") == "Reached", what="fired")
        await until(lambda: (row(db_url, "acme", "tick") or {}).get("fired_count") == 1, what="tick fired")
        assert dict(query(db_url, PENDING)) == {"acme": 6, "globex": 5} and count_is_exact(db_url)

        await send("cancel", "acme", {"tenantId": "acme", "serviceCallId": "f0"})
        await send("cancel", "globex", {"tenantId": "globex", "serviceCallId": "never-scheduled"})
        await until(lambda: _ids(db_url, "globex", "Cancelled") == {"never-scheduled"}, what="tombstone")
        await until(lambda: _ids(db_url, "acme", "Cancelled") == {"f0"}, what="cancelled")
        assert count_is_exact(db_url)
        await send("schedule", "acme", _schedule("acme", "f0", far))  # a cancelled timer again
        await until(lambda: "f0" in _ids(db_url, "acme"), what="rescheduled")
        assert count_is_exact(db_url)

        await send("pause", "globex", {"tenantId": "globex"})
        await until(lambda: len(_ids(db_url, "globex", "Paused")) == 5, what="paused")
        await send("schedule", "globex", _schedule("globex", "late", far))
        await until(lambda: "late" in _ids(db_url, "globex", "Paused"), what="stored paused")
        assert dict(query(db_url, PENDING))["globex"] == 6 and count_is_exact(db_url)
        await send("resume", "globex", {"tenantId": "globex"})
        await until(lambda: len(_ids(db_url, "globex")) == 6, what="resumed")
        assert count_is_exact(db_url)

    assert await store.delete_finished(timedelta(0), 100) == 2  # "once" and the tombstone
    assert count_is_exact(db_url)
    query(db_url, "DELETE FROM timers WHERE tenant_id = 'acme' AND service_call_id = 'f1'")  # an operator's
    assert dict(query(db_url, PENDING))["acme"] == 5 and count_is_exact(db_url)
    while await store.compact_pending(3) == 3:  # folding, a few rows at a time
        assert count_is_exact(db_url)
    assert query(db_url, "SELECT tenant_id, count(*) FROM tenant_pending GROUP BY 1 ORDER BY 1") == [
        ("acme", 1),
        ("globex", 1),
    ]
    assert count_is_exact(db_url)
    query(db_url, "TRUNCATE timers")
    assert count_is_exact(db_url) and query(db_url, COUNTED) == []


def most_pages(node: dict[str, Any]) -> int:
    """The most pages any node of a plan read (a subplan's own count is not always its parent's)."""
    own = int(node["Shared Hit Blocks"] + node["Shared Read Blocks"])
    return max([own, *(most_pages(child) for child in node.get("Plans", []))])


async def test_counting_a_tenant_reads_the_same_few_pages_whatever_its_timers(db_url: str) -> None:
    """The quota's read of a tenant with 100,000 pending timers touches no more of the database than
    that of a tenant with 10, a few pages: it was a walk of the tenant's rows, or of the table."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at)"
        " SELECT CASE WHEN i < 10 THEN 'small' ELSE 'big' END, 'k-' || md5(i::text), 'Scheduled',"
        " now() + interval '1 day' FROM generate_series(0, 100009) AS i",
    )
    query(db_url, "VACUUM ANALYZE timers")

    def pages(tenant: str) -> int:
        with psycopg.connect(db_url, autocommit=True) as conn:
            explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["quota_pending_counts"]
            [(plan,)] = conn.execute(explain, {"tenant_id": [tenant], "cap": 1_000_000}).fetchall()
        return most_pages(plan[0]["Plan"])

    small, big = pages("small"), pages("big")
    # An index page or two, and the rows' page: the timers table itself is 3,000+ pages here.
    assert max(small, big) <= 5, f"pages read: a tenant of 10 timers {small}, of 100,000 {big}"
    assert dict(query(db_url, COUNTED)) == {"big": 100_000, "small": 10}
