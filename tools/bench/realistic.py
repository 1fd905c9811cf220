"""A timers table as months of scheduling leave it (issue 36), built in one statement.

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

# Bench-only SQL (none of it runs in a replica). Keys: a prefix and the hex of a hash of the row's
# number, cut to KEY_CHARS: unique, and in no order a scan of the table would follow. dueAt: a
# random moment between 1 and 30 days from now.
REALISTIC_SQL = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)
SELECT 'tenant-' || (i %% %(tenants)s), left(%(prefix)s || md5(i::text) || md5(i::text), %(key_chars)s),
       'Scheduled', d, d
FROM generate_series(1, %(rows)s) AS i,
     LATERAL (SELECT now() + interval '1 day' + random() * interval '29 days' + i * interval '0') AS t(d)
"""


def build_realistic(
    db_url: str, rows: int, tenants: int = FULL_TENANTS, prefix: str = "r-", analyze: bool = True
) -> None:
    """Add `rows` pending timers of `tenants` tenants to the database's table, then VACUUM ANALYZE
    it (unless not `analyze`: statistics left as they were, as before autovacuum gets to it)."""
    if len(prefix) >= KEY_CHARS:
        raise ValueError(f"key prefix {prefix!r} leaves no room in a {KEY_CHARS}-character key")
    params: dict[str, Any] = {"rows": rows, "tenants": tenants, "prefix": prefix, "key_chars": KEY_CHARS}
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(REALISTIC_SQL, params)
        if analyze:
            conn.execute("VACUUM ANALYZE timers")
