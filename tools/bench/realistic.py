"""A timers table as months of scheduling leave it (issue 36), built in one statement, with due
timers among its rows when asked (issue 37's table shapes, tools/bench/shapes.py).

Many tenants, keys as long as real ones, every timer due 1 to 30 days ahead in random order: the
heap holds the rows in the order they were scheduled, which is not the order they come due, so
the planner sees due order uncorrelated with heap order, as on a production table (a table seeded
in due order, as Rig.seed does, hides what that does to a plan). VACUUM ANALYZE leaves it as
autovacuum would. Shared by the scenarios (and tests) that need such a table beside their own load.
"""

from __future__ import annotations

from typing import Any

import psycopg

FULL_ROWS = 5_000_000
FULL_TENANTS = 1000
KEY_CHARS = 34  # as long as the keys of the study's table
DUE_PREFIX = "d-"  # the keys of the due rows: d-1, d-2, ... in due order

# When row i (numbered from 1) comes due. A row whose number `every` divides is due: the j-th of
# them (j = i / every) at start_s + (j - 1) / rate seconds from now, so those come due in order
# wherever they sit in the heap (every = 1: all of them, in heap order; every > rows: none).
# Every other row is due at a random moment between 1 and 30 days from now (`+ i * interval '0'`
# makes the planner draw it per row). Shared with the peers' inserts (tools/bench/peers.py).
DUE_AT_SQL = """CASE WHEN i %% %(every)s = 0
     THEN now() + make_interval(secs => %(start_s)s + (i / %(every)s - 1) / %(rate)s::float8)
     ELSE now() + interval '1 day' + random() * interval '29 days' + i * interval '0' END"""

# Bench-only SQL (none of it runs in a replica). Keys of the pending rows: a prefix and the hex of
# a hash of the row's number, cut to KEY_CHARS: unique, and in no order a scan of the table would
# follow.
JOBS_SQL = f"""
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)
SELECT 'tenant-' || (i %% %(tenants)s),
       CASE WHEN i %% %(every)s = 0 THEN %(due_prefix)s || (i / %(every)s)
            ELSE left(%(prefix)s || md5(i::text) || md5(i::text), %(key_chars)s) END,
       'Scheduled', d, d
FROM generate_series(1, %(rows)s::int) AS i, LATERAL (SELECT {DUE_AT_SQL}) AS t(d)
"""


def insert_timers(
    db_url: str,
    rows: int,
    every: int,
    start_s: float,
    rate: float,
    tenants: int = FULL_TENANTS,
    prefix: str = "r-",
) -> None:
    """Add `rows` Scheduled timers of `tenants` tenants, those whose number `every` divides due
    from now + start_s at `rate` per second (keys d-1, d-2, ...), the others 1 to 30 days ahead."""
    if len(prefix) >= KEY_CHARS:
        raise ValueError(f"key prefix {prefix!r} leaves no room in a {KEY_CHARS}-character key")
    params: dict[str, Any] = {
        "rows": rows,
        "every": every,
        "start_s": start_s,
        "rate": rate,
        "tenants": tenants,
        "prefix": prefix,
        "due_prefix": DUE_PREFIX,
        "key_chars": KEY_CHARS,
    }
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(JOBS_SQL, params)


def build_realistic(
    db_url: str, rows: int, tenants: int = FULL_TENANTS, prefix: str = "r-", analyze: bool = True
) -> None:
    """Add `rows` pending timers of `tenants` tenants to the database's table, then VACUUM ANALYZE
    it (unless not `analyze`: statistics left as they were, as before autovacuum gets to it)."""
    insert_timers(db_url, rows, every=rows + 1, start_s=0, rate=1, tenants=tenants, prefix=prefix)
    if analyze:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE timers")
