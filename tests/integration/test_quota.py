"""Per-tenant limit on pending timers (TIMER_TENANT_MAX_PENDING, issue 6)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import psycopg

from tests.helpers import iso_in, jetstream, publish_raw, query, row, running_replica, until
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.contract import CancelTimer, Command, ScheduleTimer
from worker.core.domain import Key
from worker.core.ports import IntakeStore
from worker.core.quota import over_limit, over_quota


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


class BoundedStore:
    """over_limit's reads: a bound per tenant, and the exact view, which records what it was asked."""

    def __init__(self, bounds: dict[str, int], pending: dict[str, int]) -> None:
        self.bounds, self.pending = bounds, pending
        self.asked: list[tuple[list[Key], list[str]]] = []

    async def pending_bounds(self, tenants: Sequence[str]) -> dict[str, int]:
        return {t: self.bounds.get(t, 0) for t in tenants}

    async def quota_view(
        self, keys: Sequence[Key], tenants: Sequence[str], cap: int
    ) -> tuple[set[Key], dict[str, int]]:
        self.asked.append((sorted(keys), list(tenants)))
        return set(), {t: min(cap, self.pending.get(t, 0)) for t in tenants}


async def test_only_tenants_whose_bound_leaves_no_room_are_counted_and_refused_on_the_count() -> None:
    """A batch's tenants whose bound has room for all their ScheduleTimers pass unread; the others
    are counted exactly, and a stale bound (timers that ended since) refuses nothing."""
    due = datetime.now(UTC) + timedelta(hours=1)
    batch: list[Command] = [
        ScheduleTimer(t, f"{t}{i}", due, None, None, None)
        for t in ("roomy", "stale", "full")
        for i in range(2)
    ]
    store = BoundedStore({"roomy": 8, "stale": 9, "full": 10}, {"roomy": 8, "stale": 1, "full": 9})
    assert await over_limit(cast(IntakeStore, store), batch, limit=10) == [5]
    assert store.asked == [
        ([("full", "full0"), ("full", "full1"), ("stale", "stale0"), ("stale", "stale1")], ["full", "stale"])
    ]


def _body(tenant: str, sc: str, due: str) -> bytes:
    return json.dumps(_schedule(tenant, sc, due)).encode()


def _schedule(tenant: str, sc: str, due: str) -> dict[str, object]:
    return {"tenantId": tenant, "serviceCallId": sc, "dueAt": due}


PENDING = "SELECT tenant_id, count(*) FROM timers WHERE state IN ('Scheduled', 'Paused') GROUP BY tenant_id"
BOUNDS = "SELECT tenant_id, sum(pending) FROM tenant_pending GROUP BY tenant_id HAVING sum(pending) <> 0"
EVERY = 10**6  # a cap no tenant here reaches: the quota's counts are exact below it


async def count_is_exact(db_url: str, store: Store) -> bool:
    """The quota's bound of every tenant covers its pending timers, counted anew; its exact count
    (the one that refuses commands) is them; and after that count, the bound is too."""
    pending = dict(query(db_url, PENDING))
    tenants = sorted(set(pending) | set(dict(query(db_url, BOUNDS))))
    bounds = await store.pending_bounds(tenants)
    _, counted = await store.quota_view([], tenants, cap=EVERY)
    real = {t: pending.get(t, 0) for t in tenants}
    return (
        all(bounds[t] >= real[t] for t in tenants)
        and counted == real
        and await store.pending_bounds(tenants) == real
    )


async def test_the_pending_count_stays_exact_through_every_change_of_a_timer(
    settings: Settings, db_url: str, store: Store
) -> None:
    """Schedules, a reschedule of a cancelled timer, cancels (and a cancel before any schedule),
    firings (one-shot: Reached; recurring: still pending), a tenant's pause and resume with a new
    timer stored paused, retention, an operator's delete and revival, the folds and a truncate:
    after each, the bound still covers the real count, and the exact count is the real one."""
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
        assert dict(query(db_url, PENDING)) == {"acme": 6, "globex": 5} and await count_is_exact(
            db_url, store
        )

        await send("cancel", "acme", {"tenantId": "acme", "serviceCallId": "f0"})
        await send("cancel", "globex", {"tenantId": "globex", "serviceCallId": "never-scheduled"})
        await until(lambda: _ids(db_url, "globex", "Cancelled") == {"never-scheduled"}, what="tombstone")
        await until(lambda: _ids(db_url, "acme", "Cancelled") == {"f0"}, what="cancelled")
        assert await count_is_exact(db_url, store)
        await send("schedule", "acme", _schedule("acme", "f0", far))  # a cancelled timer again
        await until(lambda: "f0" in _ids(db_url, "acme"), what="rescheduled")
        assert dict(query(db_url, BOUNDS))["acme"] == 6 and await count_is_exact(db_url, store)

        await send("pause", "globex", {"tenantId": "globex"})
        await until(lambda: len(_ids(db_url, "globex", "Paused")) == 5, what="paused")
        await send("schedule", "globex", _schedule("globex", "late", far))
        await until(lambda: "late" in _ids(db_url, "globex", "Paused"), what="stored paused")
        assert dict(query(db_url, PENDING))["globex"] == 6 and await count_is_exact(db_url, store)
        await send("resume", "globex", {"tenantId": "globex"})
        await until(lambda: len(_ids(db_url, "globex")) == 6, what="resumed")
        assert await count_is_exact(db_url, store)

    assert await store.delete_finished(timedelta(0), 100) == 2  # "once" and the tombstone
    assert await count_is_exact(db_url, store)
    query(db_url, "DELETE FROM timers WHERE tenant_id = 'acme' AND service_call_id = 'f1'")  # an operator's
    assert dict(query(db_url, PENDING))["acme"] == 5 and await count_is_exact(db_url, store)
    query(db_url, "INSERT INTO timers (tenant_id, service_call_id, state) VALUES ('acme', 'op', 'Cancelled')")
    query(db_url, "UPDATE timers SET state = 'Scheduled', due_at = now() WHERE service_call_id = 'op'")
    assert dict(query(db_url, PENDING))["acme"] == 6 and await count_is_exact(db_url, store)

    async def folded() -> bool:  # a few rows at a time (none while another fold runs)
        await store.compact_pending(3)
        assert await count_is_exact(db_url, store)
        return query(db_url, "SELECT count(*) FROM tenant_pending") == [(len(query(db_url, BOUNDS)),)]

    await until(folded, what="folded")
    assert query(db_url, "SELECT tenant_id, count(*) FROM tenant_pending GROUP BY 1 ORDER BY 1") == [
        ("acme", 1),
        ("globex", 1),
    ]
    assert await count_is_exact(db_url, store)
    query(db_url, "TRUNCATE timers")
    assert await count_is_exact(db_url, store) and query(db_url, BOUNDS) == []


async def test_firing_leaves_the_quota_bound_alone(settings: Settings, db_url: str) -> None:
    """Claims and records write timers at every fire: nothing of the quota's bound is written then
    (a statement trigger counting them cost Postgres 26% more CPU per fire, docs/BENCHMARKS.md)."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) SELECT 't' || (i %% 50),"
        " 'k' || i, 'Scheduled', now() - interval '1 minute' FROM generate_series(1, 2000) AS i",
    )
    stored = query(db_url, "SELECT count(*), sum(pending) FROM tenant_pending")
    async with running_replica(settings):
        await until(lambda: query(db_url, "SELECT count(*) FROM timers WHERE state = 'Reached'") == [(2000,)])
    assert query(db_url, "SELECT count(*), sum(pending) FROM tenant_pending") == stored == [(50, 2000)]


async def test_a_tenant_whose_timers_fired_has_room_again(settings: Settings, db_url: str) -> None:
    """The bound keeps the fired timers of a tenant at its limit: its next ScheduleTimers are
    counted exactly and admitted, never refused on the bound."""
    now = iso_in(0, db_url)
    async with running_replica(settings, tenant_max_pending=3), jetstream(settings) as js:
        for i in range(3):
            await publish_raw(js, settings, "acme", "schedule", _schedule("acme", f"a{i}", now))
        await until(lambda: len(_ids(db_url, "acme", "Reached")) == 3, what="fired")
        assert dict(query(db_url, BOUNDS)) == {"acme": 3}  # their ends are not counted
        for i in range(3):
            await publish_raw(
                js, settings, "acme", "schedule", _schedule("acme", f"b{i}", iso_in(3600, db_url))
            )
        await until(lambda: len(_ids(db_url, "acme")) == 3, what="admitted")
    assert dict(query(db_url, BOUNDS)) == {"acme": 3}  # recounted at 0, then the three new


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
            explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES["quota_bounds"]
            [(plan,)] = conn.execute(explain, {"tenant_id": [tenant]}).fetchall()
        return most_pages(plan[0]["Plan"])

    small, big = pages("small"), pages("big")
    # An index page or two, and the rows' page: the timers table itself is 3,000+ pages here.
    assert max(small, big) <= 5, f"pages read: a tenant of 10 timers {small}, of 100,000 {big}"
    assert dict(query(db_url, BOUNDS)) == {"big": 100_000, "small": 10}
