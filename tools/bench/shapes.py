"""The tables a drain meets, built alike for every system, and `drain-shapes`, this service's
drain on each (docs/BENCHMARKS.md says what each stands for):

- `fresh`: the due jobs alone, in due order, in an empty table;
- `burst`: the due jobs appended to a big table of jobs due 1 to 30 days ahead, after its last
  VACUUM ANALYZE (its statistics say few are due, as after any large burst);
- `scattered`: the due jobs spread evenly through the big table's heap, the table analysed;
- `churned`: the big table, one row in CHURN_EVERY deleted through the heap (retention), VACUUM
  ANALYZE, then the burst: it lands where the free space map sends it.

Each system adds its jobs its own way (an `AddJobs`); every drain starts right after a CHECKPOINT,
so its first write of a page carries the page's full image, as on a server running a while.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tools.bench.realistic import DUE_PREFIX, insert_timers
from tools.bench.rig import WAL_LSN_SQL, Context, Metrics, admin, until_fired, until_marked

SHAPES = ("fresh", "burst", "scattered", "churned")
FULL_BIG = 5_000_000  # jobs due 1 to 30 days ahead in the big table
FULL_DUE = 50_000  # due jobs in each drain of drain-shapes
OVERDUE_S = 3660  # the due jobs came due over the last hour, the first an hour and a minute ago
CHURN_EVERY = 50  # `churned`: retention deleted one row in 50 of the big table

# Bench-only: delete every CHURN_EVERY-th row in heap order (the table's name is the system's own).
CHURN_SQL = """
DELETE FROM {table} WHERE ctid = ANY (ARRAY(
  SELECT ctid FROM (SELECT ctid, row_number() OVER (ORDER BY ctid) AS n FROM {table}) AS heap
  WHERE n % {every} = 0))
"""
DUE_PAGES_SQL = "SELECT count(DISTINCT (ctid::text::point)[0]) FROM {table} WHERE {due}"

# (rows, every, start_s, rate): `rows` jobs numbered from 1, those `every` divides due from
# now + start_s at `rate` a second, the others 1 to 30 days ahead (realistic.DUE_AT_SQL).
AddJobs = Callable[[int, int, float, float], None]


@dataclass(frozen=True)
class JobTable:
    """Where a system stores its jobs, and the WHERE clause of its due ones."""

    name: str
    due: str


TIMERS = JobTable("timers", f"service_call_id LIKE '{DUE_PREFIX}%'")  # this service's


def build(shape: str, db_url: str, add_jobs: AddJobs, table: JobTable, due: int, big: int) -> int:
    """Build `shape` with `due` overdue jobs (and `big` pending but for `fresh`), then CHECKPOINT;
    the heap pages the due jobs sit on, counted before it (its reads set hint bits, and with data
    checksums the first hint after a checkpoint writes the page's image, not the drain)."""
    rate = due / (OVERDUE_S - 60)
    if shape == "scattered":
        every = (big + due) // due
        add_jobs(every * due, every, -OVERDUE_S, rate)
        admin(db_url, "VACUUM ANALYZE")
    elif shape in ("burst", "churned"):
        add_jobs(big, big + 1, 0, 1)  # none due
        if shape == "churned":
            admin(db_url, CHURN_SQL.format(table=table.name, every=CHURN_EVERY))
        admin(db_url, "VACUUM ANALYZE")
        add_jobs(due, 1, -OVERDUE_S, rate)
    elif shape == "fresh":
        add_jobs(due, 1, -OVERDUE_S, rate)
        admin(db_url, "VACUUM ANALYZE")
    else:
        raise ValueError(f"unknown table shape {shape!r} (known: {', '.join(SHAPES)})")
    pages = admin(db_url, DUE_PAGES_SQL.format(table=table.name, due=table.due))
    admin(db_url, "CHECKPOINT")
    return int(pages or 0)


def add_timers(db_url: str) -> AddJobs:
    """This service's AddJobs: rows straight into its table."""
    return lambda rows, every, start_s, rate: insert_timers(db_url, rows, every, start_s, rate)


async def drain_shape(ctx: Context, shape: str, due: int, big: int) -> Metrics:
    """One drain of `due` overdue timers from `shape`: fires/s, WAL per fire, the due rows' pages."""
    async with ctx.rig() as rig:
        ctx.progress(f"{shape}: building {due:,} due" + ("" if shape == "fresh" else f" among {big:,}"))
        pages = await asyncio.to_thread(build, shape, rig.db_url, add_timers(rig.db_url), TIMERS, due, big)
        wal = int(await rig.scalar(WAL_LSN_SQL))
        rig.start_replicas(ctx.replicas)
        await until_fired(rig, due, timeout=60 + due / 500 + big / 20_000, progress=ctx.progress, rss=[])
        left = await until_marked(rig, DUE_PREFIX)
        wal = int(await rig.scalar(WAL_LSN_SQL)) - wal
        state = await rig.events_state()
        return {
            f"{shape}_fires_per_s": due / state.span_s,
            f"{shape}_wal_bytes_per_fire": wal / due,
            f"{shape}_left_scheduled": left,
            f"{shape}_due_pages": pages,
        }


async def drain_shapes(ctx: Context) -> Metrics:
    """50,000 overdue timers from each shape in turn, and the big shapes' rates over fresh's."""
    due, big = ctx.n(FULL_DUE), ctx.n(FULL_BIG)
    m: Metrics = {"timers": due, "big_rows": big}
    for shape in SHAPES:
        m |= await drain_shape(ctx, shape, due, big)
    for shape in SHAPES[1:]:
        m[f"{shape}_over_fresh"] = m[f"{shape}_fires_per_s"] / m["fresh_fires_per_s"]
    return m
