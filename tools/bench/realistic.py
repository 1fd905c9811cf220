"""A timers table as months of scheduling leave it: many tenants, keys as long as real ones, due
1 to 30 days ahead in an order unrelated to the heap's (a table seeded in due order hides what
that does to a plan), with due timers among them when asked (shapes.py)."""

from __future__ import annotations

from typing import Any

import psycopg

FULL_ROWS = 5_000_000
FULL_TENANTS = 1000
KEY_CHARS = 34  # as long as the keys of the study's table
DUE_PREFIX = "d-"  # the keys of the due rows: d-1, d-2, ... in due order

# When row i comes due: those whose number `every` divides at start_s + (i / every - 1) / rate s
# from now, in order wherever they sit; the others 1 to 30 days ahead (`+ i * interval '0'` makes
# the planner draw it per row). The peers' inserts share it.
DUE_AT_SQL = """CASE WHEN i %% %(every)s = 0
     THEN now() + make_interval(secs => %(start_s)s + (i / %(every)s - 1) / %(rate)s::float8)
     ELSE now() + interval '1 day' + random() * interval '29 days' + i * interval '0' END"""

# Bench-only: pending keys are the hex of a hash of the row's number, in no order a scan follows.
JOBS_SQL = f"""
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)
SELECT 'tenant-' || (i %% %(tenants)s),
       CASE WHEN i %% %(every)s = 0 THEN %(due_prefix)s || (i / %(every)s)
            ELSE left(%(prefix)s || md5(i::text) || md5(i::text), %(key_chars)s) END,
       'Scheduled', d, d
FROM generate_series(1, %(rows)s::int) AS i, LATERAL (SELECT {DUE_AT_SQL}) AS t(d)
"""


def insert_timers(
    db_url: str, rows: int, every: int, start_s: float, rate: float, tenants: int = FULL_TENANTS
) -> None:
    """`rows` Scheduled timers, those whose number `every` divides due from now + start_s at
    `rate` a second (keys d-1, d-2, ...), the others 1 to 30 days ahead."""
    params: dict[str, Any] = {"rows": rows, "every": every, "start_s": start_s, "rate": rate}
    params |= {"tenants": tenants, "prefix": "r-", "due_prefix": DUE_PREFIX, "key_chars": KEY_CHARS}
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(JOBS_SQL, params)


def build_realistic(db_url: str, rows: int, tenants: int = FULL_TENANTS, analyze: bool = True) -> None:
    """`rows` pending timers, then VACUUM ANALYZE (unless not `analyze`, as before autovacuum)."""
    insert_timers(db_url, rows, every=rows + 1, start_s=0, rate=1, tenants=tenants)
    if analyze:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE timers")
