"""Every tenant, a page at a time: the console's tenants page and `/api/v1/tenants`. Sorted by name
(a loose scan of the primary key, one probe per tenant) or by pending timers (the quota's bounds
in tenant_pending, a few rows per tenant); never a count of a tenant's timers. Keyset paging with
opaque cursors (worker/ops/cursors.py)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from worker.adapters.postgres.queries import QUERIES
from worker.contract import TENANT_RE, TENANT_RULE
from worker.ops.cli_output import quoted
from worker.ops.cursors import COUNT, TEXT, decode, encode

SORTS = ("name", "pending")
# The tenants a page sorted by name walks at most: under a collation other than C the tenants of
# a prefix are not next to each other (docs/SQL.md, console_tenants_by_name), so a search walks on
# past them; this bounds what one look costs, and the page goes on from where the walk stopped.
MAX_WALK = 10_000
MAX_PAGE = 500


@dataclass(frozen=True, slots=True)
class TenantsPage:
    tenants: list[dict[str, Any]]  # {"tenant", "pending"}: pending is the quota's upper bound
    next_cursor: str | None  # pass back as `after`; None on the last page
    walked_to: str | None = None  # the walk's cap stopped it at this tenant before the page filled


def check_prefix(prefix: str) -> str:
    """The prefix, or ValueError in one line: it has a tenant id's characters, up to its length
    (the rule's every start is itself a tenant id)."""
    if prefix and not TENANT_RE.match(prefix):
        raise ValueError(f"a tenant prefix is the start of a tenant id ({TENANT_RULE}), not {quoted(prefix)}")
    return prefix


def tenants_page(
    conn: psycopg.Connection[Any],
    sort: str = "name",
    prefix: str = "",
    after: str | None = None,
    limit: int = 50,
    walk: int = MAX_WALK,
) -> TenantsPage:
    """A page of tenants whose id starts with `prefix`, in `sort` order, after a cursor of this
    sort. ValueError for a sort, prefix or cursor this does not know."""
    if sort not in SORTS:
        raise ValueError(f"sort: one of {', '.join(SORTS)}, not {quoted(sort)}")
    check_prefix(prefix)
    limit = max(1, min(limit, MAX_PAGE))
    shape = (COUNT, TEXT) if sort == "pending" else (TEXT,)  # (bound, tenant) or (tenant,)
    key = decode(after, *shape) if after else None
    cur = conn.cursor(row_factory=dict_row)
    if sort == "pending":
        bound, last = key if key else [sys.maxsize, ""]
        params = {"prefix": prefix, "after_pending": bound, "after_tenant": last, "limit": limit + 1}
        cur.execute(QUERIES["console_tenants_by_pending"], params)
        rows = [{"tenant": r["tenant_id"], "pending": int(r["pending"])} for r in cur.fetchall()]
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = encode([rows[-1]["pending"], rows[-1]["tenant"]]) if more else None
        return TenantsPage(rows, cursor)
    (last,) = key if key else [""]
    params = {"prefix": prefix, "after": last, "scan": walk, "limit": limit + 1}
    cur.execute(QUERIES["console_tenants_by_name"], params)
    walked = cur.fetchall()
    matching = [{"tenant": r["tenant_id"], "pending": int(r["pending"])} for r in walked if r["matches"]]
    if len(matching) > limit:
        return TenantsPage(matching[:limit], encode([matching[limit - 1]["tenant"]]))
    if walked and walked[-1]["n"] == walk:  # the cap, not the end of the tenants
        return TenantsPage(matching, encode([walked[-1]["tenant_id"]]), walked[-1]["tenant_id"])
    return TenantsPage(matching, None)
