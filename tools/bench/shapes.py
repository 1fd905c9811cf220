"""The tables a drain meets (issue 37), built alike for every system, and `drain-shapes`, this
service's drain on each.

- `fresh`: the due jobs alone, in due order, in an empty table (what the drains measured before);
- `burst`: the due jobs inserted, in due order, into a big table of jobs due 1 to 30 days ahead,
  after its last VACUUM ANALYZE: its statistics still say few are due (autoanalyze waits for a
  tenth of the table to change), as after any large burst on a production table;
- `scattered`: the due jobs spread evenly through the big table's heap, one every
  (big + due) / due rows (one every 101 at full size: each on a page of its own), as months of
  scheduling leave the jobs of one due minute; the table analysed;
- `churned`: the big table, then retention's churn: one row in CHURN_EVERY deleted, evenly
  through the heap (as retention deletes finished jobs wherever they sit), VACUUM ANALYZE (the
  free space map now offers those slots; the statistics do not know the burst), then the burst:
  where it lands is the table's doing. This service's lands in the freed slots, one row per page
  (its pages are full to the fillfactor, and a slot holds one row), as issue 37 saw.

Each system adds its jobs its own way, into its own table (an `AddJobs`: this service's rows,
graphile-worker's `add_jobs`, pgqueuer's `enqueue`); this module orders the steps and the
server's part, so every drain starts from the same state: right after a CHECKPOINT, so the
drain's first write of each page carries its full image into the WAL, as on a server that has
been running for a while.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from tools.bench.context import Context, Metrics, until_fired, until_marked
from tools.bench.realistic import DUE_PREFIX, insert_timers
from tools.bench.rig import Rig

SHAPES = ("fresh", "burst", "scattered", "churned")
FULL_BIG = 5_000_000  # jobs due 1 to 30 days ahead in the big table (issue 37)
FULL_DUE = 50_000  # due jobs in each drain of drain-shapes (issue 37)
OVERDUE_S = 3660  # the due jobs came due over the last hour, the first an hour and a minute ago
WAL_LSN_SQL = "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"  # bench-only: WAL written so far, bytes
CHURN_EVERY = 50  # `churned`: retention deleted one row in 50 (2 %) of the big table

# Bench-only: delete every CHURN_EVERY-th row of a table in heap order, so the deleted rows are
# spread over all its pages (the table's name is the system's own, never a user's input).
CHURN_SQL = """
DELETE FROM {table} WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM (SELECT ctid, row_number() OVER (ORDER BY ctid) AS n FROM {table}) AS heap
  WHERE n % {every} = 0))
"""
# Bench-only: how many heap pages a system's due jobs sit on (one each: a page written per fire).
DUE_PAGES_SQL = "SELECT count(DISTINCT (ctid::text::point)[0]) FROM {table} WHERE {due}"

# rows, every, start_s, rate: add `rows` jobs numbered from 1, those whose number `every` divides
# due from now + start_s at `rate` per second, in order, the others 1 to 30 days ahead
# (tools/bench/realistic.py, DUE_AT_SQL).
AddJobs = Callable[[int, int, float, float], None]


@dataclass(frozen=True)
class JobTable:
    """Where a system stores its jobs: the table `churned` churns, and the WHERE clause that
    picks its due jobs in it (the others are due a day ahead at the earliest)."""

    name: str
    due: str


TIMERS = JobTable("timers", f"service_call_id LIKE '{DUE_PREFIX}%'")  # this service's


def _run(db_url: str, *statements: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        for s in statements:
            conn.execute(s)


def build(shape: str, db_url: str, add_jobs: AddJobs, table: JobTable, due: int, big: int) -> int:
    """Build `shape` with `due` overdue jobs (and `big` pending ones but for `fresh`) in the
    database at `db_url` through `add_jobs`, which adds them to `table`; then CHECKPOINT. The
    heap pages the due jobs sit on, counted before the CHECKPOINT: the count's reads set hint
    bits, and with data checksums (Postgres 18's default) the first hint on a page after a
    checkpoint writes its full image, which the drain would then not write."""
    rate = due / (OVERDUE_S - 60)
    if shape == "scattered":
        every = (big + due) // due
        add_jobs(every * due, every, -OVERDUE_S, rate)
        _run(db_url, "VACUUM ANALYZE")
    elif shape in ("burst", "churned"):
        add_jobs(big, big + 1, 0, 1)  # none due
        if shape == "churned":
            _run(db_url, CHURN_SQL.format(table=table.name, every=CHURN_EVERY))
        _run(db_url, "VACUUM ANALYZE")
        add_jobs(due, 1, -OVERDUE_S, rate)
    elif shape == "fresh":
        add_jobs(due, 1, -OVERDUE_S, rate)
        _run(db_url, "VACUUM ANALYZE")
    else:
        raise ValueError(f"unknown table shape {shape!r} (known: {', '.join(SHAPES)})")
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(DUE_PAGES_SQL.format(table=table.name, due=table.due)).fetchone()
        conn.execute("CHECKPOINT")
    return int(row[0]) if row else 0


def wal_bytes(db_url: str) -> int:
    """WAL the server has written so far."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        row = conn.execute(WAL_LSN_SQL).fetchone()
        return int(row[0]) if row else 0


def add_timers(rig: Rig) -> AddJobs:
    """This service's AddJobs: rows straight into its table, as the other scenarios seed it."""
    return lambda rows, every, start_s, rate: insert_timers(rig.db_url, rows, every, start_s, rate)


async def drain_shape(ctx: Context, shape: str, due: int, big: int) -> Metrics:
    """One drain of `due` overdue timers from `shape`: fires/s (the event stream's first to last
    stored event), the WAL Postgres wrote per fire from the replicas' start to the last mark, and
    how many heap pages the due rows sat on."""
    async with ctx.rig() as rig:
        ctx.progress(f"{shape}: building {due:,} due" + ("" if shape == "fresh" else f" among {big:,}"))
        pages = await asyncio.to_thread(build, shape, rig.db_url, add_timers(rig), TIMERS, due, big)
        wal = await asyncio.to_thread(wal_bytes, rig.db_url)
        rig.start_replicas(ctx.replicas)
        await until_fired(rig, due, timeout=60 + due / 500 + big / 20_000, progress=ctx.progress, rss=[])
        left = await until_marked(rig, DUE_PREFIX)
        wal = await asyncio.to_thread(wal_bytes, rig.db_url) - wal
        state = await rig.events_state()
        return {
            f"{shape}_fires_per_s": due / state.span_s,
            f"{shape}_wal_bytes_per_fire": wal / due,
            f"{shape}_left_scheduled": left,
            f"{shape}_due_pages": pages,
        }


async def drain_shapes(ctx: Context) -> Metrics:
    """50,000 overdue timers from each shape in turn (5,000,000 pending in the big table), and
    the big shapes' rates over the fresh one's."""
    due, big = ctx.n(FULL_DUE), ctx.n(FULL_BIG)
    m: Metrics = {"timers": due, "big_rows": big}
    for shape in SHAPES:
        m |= await drain_shape(ctx, shape, due, big)
    m["burst_over_fresh"] = m["burst_fires_per_s"] / m["fresh_fires_per_s"]
    m["scattered_over_fresh"] = m["scattered_fires_per_s"] / m["fresh_fires_per_s"]
    m["churned_over_fresh"] = m["churned_fires_per_s"] / m["fresh_fires_per_s"]
    return m
