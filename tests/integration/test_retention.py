"""Retention (docs/USING.md, Retention; issue 6): finished timers are deleted after TIMER_RETENTION,
nothing else.

That a late duplicate ScheduleTimer inside the redelivery horizon does not re-arm a fired timer is
test_timers.py::test_same_command_three_times_makes_one_timer_that_fires_once; retention keeps the
row that makes that hold, since settings refuse TIMER_RETENTION < TIMER_COMMAND_MAX_AGE
(ops/test_cli.py checks the one-line error).
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
from prometheus_client import REGISTRY

from tests.helpers import iso_in, jetstream, publish_raw, query, row, running_replica, until
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.core.retention import Retention


def _deleted_so_far() -> float:
    return REGISTRY.get_sample_value("timer_retention_deleted_total") or 0.0


def _age(db_url: str, days: int, *ids: str) -> None:
    """Pretend these rows were last changed `days` ago (the only way to get old rows in a test)."""
    query(
        db_url,
        "UPDATE timers SET updated_at = now() - %s * interval '1 day' WHERE service_call_id = ANY(%s)",
        days,
        list(ids),
    )


async def test_a_replica_deletes_expired_finished_timers_and_keeps_the_rest(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings), jetstream(settings) as js:
        new_reached = _schedule("new-reached", iso_in(-1, db_url))
        await publish_raw(js, settings, "acme", "schedule", new_reached)
        await publish_raw(js, settings, "acme", "schedule", _schedule("old-reached", iso_in(-1, db_url)))
        for sc in ("old-cancelled", "new-cancelled", "old-scheduled"):
            await publish_raw(js, settings, "acme", "schedule", _schedule(sc, iso_in(3600, db_url)))
        # A recurring timer that fired but goes on: Scheduled, so kept however old.
        body = _schedule("old-recurring", iso_in(-1, db_url), repeat={"every": "PT1H"})
        await publish_raw(js, settings, "acme", "schedule", body)
        for sc in ("old-cancelled", "new-cancelled"):
            await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": sc})

        def settled() -> bool:
            states = dict(query(db_url, "SELECT service_call_id, state FROM timers"))
            return (
                states
                == {
                    "old-reached": "Reached",
                    "new-reached": "Reached",
                    "old-cancelled": "Cancelled",
                    "new-cancelled": "Cancelled",
                    "old-scheduled": "Scheduled",
                    "old-recurring": "Scheduled",
                }
                and (row(db_url, "acme", "old-recurring") or {}).get("fired_count") == 1
            )

        await until(settled, what="timers in their states")
    # Eight days against the default seven; "new-*" are one day short of it.
    _age(db_url, 8, "old-reached", "old-cancelled", "old-scheduled", "old-recurring")
    _age(db_url, 6, "new-reached", "new-cancelled")
    before = _deleted_so_far()
    async with running_replica(settings), jetstream(settings) as js:  # it sweeps as it starts
        await until(
            lambda: (
                not query(
                    db_url, "SELECT 1 FROM timers WHERE service_call_id IN ('old-reached', 'old-cancelled')"
                )
            ),
            what="expired finished timers deleted",
        )
        # Inside the retention a late copy of a fired timer's command still finds it, and is ignored.
        kept = row(db_url, "acme", "new-reached")
        assert kept is not None
        await publish_raw(js, settings, "acme", "schedule", new_reached)
        await publish_raw(js, settings, "acme", "schedule", _schedule("marker", iso_in(3600, db_url)))
        await until(lambda: row(db_url, "acme", "marker") is not None, what="commands applied")
        late = row(db_url, "acme", "new-reached")
        assert late is not None and (late["state"], late["fired_count"]) == ("Reached", 1)
        assert late["registered_at"] == kept["registered_at"]
    left = {sc for (sc,) in query(db_url, "SELECT service_call_id FROM timers")}
    assert left == {"new-reached", "new-cancelled", "old-scheduled", "old-recurring", "marker"}
    assert _deleted_so_far() - before == 2


async def test_a_sweep_deletes_in_small_batches_until_none_is_left(db_url: str, store: Store) -> None:
    query(
        db_url,
        """INSERT INTO timers (tenant_id, service_call_id, state, due_at, updated_at)
           SELECT 'acme', 'f' || i, CASE WHEN mod(i, 2) = 0 THEN 'Reached' ELSE 'Cancelled' END,
                  now() - interval '10 days', now() - interval '10 days' + i * interval '1 second'
           FROM generate_series(1, 2500) AS i""",
    )
    query(
        db_url,
        """INSERT INTO timers (tenant_id, service_call_id, state, due_at, updated_at)
           SELECT 'acme', 's' || i, 'Scheduled', now() + interval '1 hour', now() - interval '10 days'
           FROM generate_series(1, 10) AS i""",
    )
    # One statement deletes one batch, the oldest first.
    assert await store.delete_finished(timedelta(days=7), 1000) == 1000
    assert query(
        db_url, "SELECT min(substr(service_call_id, 2)::int) FROM timers WHERE state <> 'Scheduled'"
    ) == [(1001,)]
    # A sweep goes on batch after batch until one comes back short.
    sweeper = Retention(store, timedelta(days=7), batch=1000)
    assert await sweeper.sweep() == 1500
    assert await sweeper.sweep() == 0
    assert query(db_url, "SELECT state, count(*) FROM timers GROUP BY state") == [("Scheduled", 10)]


def _schedule(sc: str, due: str, **extra: object) -> dict[str, object]:
    return {"tenantId": "acme", "serviceCallId": sc, "dueAt": due, **extra}


# Issue 23 review, defect 6: retention reads past every long-paused row, in every batch of every
# sweep. Paused rows are in timers_finished (WHERE state <> 'Scheduled', ordered by updated_at), and a
# pause older than TIMER_RETENTION puts them at the head of that order, so delete_finished walks (and
# visits the heap of) all of them before each batch of deletable rows: a sweep of B batches reads
# B x paused rows. A tenant can set this up alone (schedule its quota, pause, wait). Root cause:
# sql/queries/upkeep.sql delete_finished + timers_finished (0001) not excluding Paused (0011 kept the index).
async def test_a_retention_batch_does_not_walk_long_paused_rows(settings: Settings, db_url: str) -> None:
    paused = 50000
    async with running_replica(settings):
        pass  # migrated
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, updated_at)"
        " SELECT 'sleepy', 'sc-' || lpad(g::text, 7, '0'), 'Paused', now(), now(), now() - interval '30 days'"
        " FROM generate_series(1, %s) g",
        paused,
    )
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, updated_at)"
        " SELECT 'done', 'sc-' || g, 'Reached', now(), now(), now() - interval '10 days'"
        " FROM generate_series(1, 100) g",
    )
    query(db_url, "ANALYZE timers")
    sql = QUERIES["delete_finished"].replace("%(retention)s", "'7 days'").replace("%(limit)s", "50")
    with psycopg.connect(db_url) as conn:
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql).fetchall())
        conn.rollback()
    removed = sum(
        int(line.split(marker)[1])
        for line in plan.splitlines()
        if (marker := "Rows Removed by Filter:") in line
    )
    # 50 rows deleted; the statement should not read tens of thousands of others to find them.
    assert removed < 1000, f"one retention batch of 50 read past {removed} paused rows:\n{plan}"


# Issue 36's soak: on a table of 5,000,000 pending timers whose statistics were taken before any
# timer finished (every row Scheduled, as after a bulk load, or on a quiet table between
# autoanalyzes), the first sweep's DELETE ran for minutes of CPU instead of milliseconds. Joined
# back to its batch by key, the planner, expecting no finished row, read the rows to delete
# through timers_done once per row of the batch (a nested loop: batch x finished rows), and held
# back the vacuum horizon all that time, so every claim re-read the index entries of every timer
# fired meanwhile. Root cause: sql/queries/upkeep.sql delete_finished joined by key, not by row id.
async def test_a_retention_batch_finds_its_rows_by_id_whatever_the_statistics(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings):
        pass  # migrated
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
        " SELECT 't' || (g %% 100), 'sc-' || g, 'Scheduled', now() + interval '1 day',"
        "  now() + interval '1 day' FROM generate_series(1, 100000) g",
    )
    query(db_url, "ANALYZE timers")  # every row pending: no finished row in the statistics
    query(
        db_url,
        "UPDATE timers SET state = 'Reached', updated_at = now() - interval '10 days'"
        " WHERE service_call_id LIKE 'sc-%%00'",  # 1,000 timers fired since
    )
    sql = QUERIES["delete_finished"].replace("%(retention)s", "'7 days'").replace("%(limit)s", "2000")
    with psycopg.connect(db_url) as conn:
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql).fetchall())
        conn.rollback()
    read = sum(
        int(line.split(marker)[1])
        for line in plan.splitlines()
        for marker in ("Rows Removed by Filter:", "Rows Removed by Join Filter:")
        if marker in line
    )
    # 1,000 rows deleted; the statement should not read a million others to find them.
    assert "Delete on timers" in plan and read < 2000, f"one retention batch read past {read} rows:\n{plan}"
