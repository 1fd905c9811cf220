"""The console's browsing reads: a tenant's timers sorted either way with previous and next pages,
and the search across tenants (by serviceCallId, by correlationId). Keyset paging as in
worker/ops/reads.py: a page costs what it reads, however deep; cursors are opaque
(worker/ops/cursors.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from worker.adapters.postgres import bulk
from worker.adapters.postgres.bulk import label_terms
from worker.adapters.postgres.queries import QUERIES
from worker.ops.cursors import TEXT, TIME, decode, encode
from worker.ops.reads import _EARLIEST

# by serviceCallId (the primary key) or by dueAt (Scheduled timers only: the due index); "-" for
# descending.
SORTS = ("id", "-id", "due", "-due")
FOUND_MAX = 200
_LATEST = datetime.fromisoformat("9999-12-31T23:59:59+00:00")


@dataclass(frozen=True, slots=True)
class TenantPage:
    rows: list[dict[str, Any]]
    sort: str
    prev_cursor: str | None  # pass back as `before`
    next_cursor: str | None  # pass back as `after`


def _key(row: dict[str, Any], by_due: bool) -> str:
    if by_due:
        return encode([row["due_at"].isoformat(), row["tenant_id"], row["service_call_id"]])
    return encode([row["service_call_id"]])


def tenant_page(
    conn: psycopg.Connection[Any],
    tenant: str,
    state: str | None,
    sort: str = "id",
    after: str | None = None,
    before: str | None = None,
    limit: int = 50,
    labels: dict[str, str] | None = None,
) -> TenantPage:
    """A page of one tenant's timers in `sort` order, after (or before) a cursor of this sort; those
    carrying every pair of `labels` only (in key order: an id sort). ValueError for a sort or a
    cursor this does not know."""
    if sort not in SORTS or (labels and sort.endswith("due")):
        raise ValueError(f"sort: one of {', '.join(SORTS)}, by id with labels")
    by_due, descending = sort.endswith("due"), sort.startswith("-")
    # Walking the index forwards (ascending order, next page) or backwards.
    forwards = (before is None) != descending
    cursor = before if before is not None else after
    key = (decode(cursor, TIME, TEXT, TEXT) if by_due else decode(cursor, TEXT)) if cursor else None
    cur = conn.cursor(row_factory=dict_row)
    if by_due:
        if key is None:
            due, tid, sid = (_EARLIEST, "", "") if forwards else (_LATEST, "\U0010ffff", "\U0010ffff")
        else:
            due, tid, sid = key
        if forwards:
            args = {"after_due": due, "after_tenant": tid, "after_id": sid, "due_to": None}
            cur.execute(QUERIES["inspect_due_timers"], {**args, "tenant_id": tenant, "limit": limit + 1})
        else:
            args = {"before_due": due, "before_tenant": tid, "before_id": sid}
            cur.execute(QUERIES["console_due_back"], {**args, "tenant_id": tenant, "limit": limit + 1})
    else:
        terms = label_terms(tenant, labels) if labels else None
        common = {"tenant_id": tenant, "state": state, "limit": limit + 1, "terms": terms}
        common |= {"after": key[0] if key and forwards else "", "due_from": None, "due_to": None}
        with conn.transaction():  # a label's page planned as select_labelled plans a chunk
            if labels:
                bulk.plan_listing(conn, common)
            if forwards:
                cur.execute(QUERIES["inspect_tenant_timers"], common, prepare=False if labels else None)
            else:
                back = {**common, "before": key[0] if key else "\U0010ffff"}
                cur.execute(QUERIES["console_tenant_back"], back, prepare=False if labels else None)
    rows = cur.fetchall()
    more = len(rows) > limit
    rows = rows[:limit]
    if before is not None:
        rows.reverse()  # read walking back from the cursor: shown in the page's order
    first, last = (_key(rows[0], by_due), _key(rows[-1], by_due)) if rows else (None, None)
    if before is not None:
        return TenantPage(rows, sort, first if more else None, last)
    return TenantPage(rows, sort, first if after is not None else None, last if more else None)


def find(conn: psycopg.Connection[Any], text: str) -> list[dict[str, Any]]:
    """Timers of any tenant whose serviceCallId or correlationId is `text`."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(QUERIES["console_find_id"], {"service_call_id": text, "limit": FOUND_MAX})
    rows = cur.fetchall()
    cur.execute(QUERIES["console_find_correlation"], {"correlation_id": text, "limit": FOUND_MAX})
    seen = {(r["tenant_id"], r["service_call_id"]) for r in rows}
    return rows + [r for r in cur.fetchall() if (r["tenant_id"], r["service_call_id"]) not in seen]


def labelled_count(
    conn: psycopg.Connection[Any],
    tenant: str,
    labels: dict[str, str],
    cap: int,
    states: tuple[str, ...] = ("Scheduled", "Paused"),
) -> int:
    """How many of the tenant's timers in `states` (Scheduled, Paused or both) carry every pair of
    `labels`, up to `cap`: what a bulk action on them would act on now (the console's offer and
    confirmation)."""
    params = {"tenant_id": tenant, "terms": label_terms(tenant, labels), "cap": cap, "states": list(states)}
    row = conn.execute(QUERIES["console_labelled_count"], params, prepare=False).fetchone()
    return int(row[0]) if row else 0
