"""The console's JSON API (`/api/v1/...`): every page's data, read-only, behind the same door and
roles as the pages (a reader may read; nothing here acts). Each answer is what the CLI's `--json`
prints for the same read (reads.camel: the contract's camelCase, its times), so a script moves
between the two; docs/OPERATIONS.md, The console's JSON API, documents the shapes. Bad input is
`400` with {"error": one line}; a timer or entry not there `404` likewise."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from worker.contract import TENANT_RE, TENANT_RULE
from worker.core.fields import identifier_problem
from worker.ops import browse, reads, tenants
from worker.ops.cli_output import quoted
from worker.ops.console.base import console_of, headers
from worker.ops.console.dlq_views import dlq_filter, sequence
from worker.ops.console.tenant_views import tenant_query
from worker.ops.console.views import overview_data
from worker.ops.console.views import tenant_query as timers_query

# Rows one answer holds at most (tenants, timers, DLQ entries): `limit` asks for fewer.
MAX_LIMIT = 500
DEFAULT_LIMIT = 50


def _json(data: Any, status_code: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status_code, headers=headers())


def _error(message: str, status_code: int = 400) -> JSONResponse:
    return _json({"error": message}, status_code)


def _limit(request: Request) -> int:
    """The `limit` asked for, within 1..MAX_LIMIT; ValueError for one that is not a number."""
    given = request.query_params.get("limit") or str(DEFAULT_LIMIT)
    if not (given.isascii() and given.isdigit()) or len(given) > 6:
        raise ValueError(f"limit: a whole number from 1 to {MAX_LIMIT}, not {quoted(given, 30)}")
    return max(1, min(int(given), MAX_LIMIT))


async def overview(request: Request) -> JSONResponse:
    """`status --json`'s report, with the console's own reads: the replicas, the lateness card and
    the counts' age (they are read at most every 30 s)."""
    found = await overview_data(console_of(request))
    backlog = found["backlog"]
    report = {
        **found["counts"],
        **found["now"],
        "running": [r["worker_id"] for r in found["replicas"] if r["alive"]],
        "commands": backlog.as_dict() if backlog is not None else {"unknown": "no answer from NATS"},
        "counted_ago_s": round(found["counted_s"], 1),
        "replicas": found["replicas"],
        "lateness": found["late"],
    }
    return _json(reads.camel(report))


async def tenant_list(request: Request) -> JSONResponse:
    """Every tenant, a page at a time: {"tenants": [{"tenant", "pending"}], "next", "walkedTo"}."""
    q = tenant_query(request.query_params)
    try:
        page = await console_of(request).db(
            tenants.tenants_page, q["sort"], q["prefix"], q["after"], _limit(request)
        )
    except ValueError as exc:
        return _error(str(exc))
    return _json({"tenants": page.tenants, "next": page.next_cursor, "walkedTo": page.walked_to})


async def tenant(request: Request) -> JSONResponse:
    """`status --tenant T --json`: the tenant's timers by state, overdue ones, the next due."""
    name = request.path_params["tenant"]
    if not TENANT_RE.match(name):
        return _error(f"not a tenant id ({TENANT_RULE})")
    return _json(reads.camel(await console_of(request).db(reads.tenant_summary, name)))


async def timer_list(request: Request) -> JSONResponse:
    """A tenant's timers as its page lists them (`state`, `sort`, `label`, `after`/`before`), each as
    `list --json` prints it: {"timers": [...], "next", "prev"}."""
    p = request.query_params
    name = p.get("tenant") or ""
    if not TENANT_RE.match(name):
        return _error(f"tenant: give one tenant id ({TENANT_RULE})")
    try:
        state, sort, labels = timers_query(p)
        limit = _limit(request)
        args = (name, state, sort, p.get("after"), p.get("before"), limit, labels)
        page = await console_of(request).db(browse.tenant_page, *args)
    except ValueError as exc:  # a filter, a limit or a cursor not of this listing
        return _error(str(exc))
    return _json(
        {"timers": [reads.row_json(r) for r in page.rows], "next": page.next_cursor, "prev": page.prev_cursor}
    )


async def timer(request: Request) -> JSONResponse:
    """`describe --json`: every field of one timer and why it has (not) fired."""
    name, sid = request.path_params["tenant"], request.path_params["sid"]
    if not TENANT_RE.match(name):
        return _error(f"not a tenant id ({TENANT_RULE})")
    if (problem := identifier_problem(sid, "serviceCallId")) is not None:
        return _error(problem)
    view = await console_of(request).db(reads.describe, name, sid)
    if view is None:
        return _error("no such timer", 404)
    return _json(view)


async def dlq_list(request: Request) -> JSONResponse:
    """`dlq list --json`: {"entries": [...], "next"}, filtered as the DLQ page (tenant, reason, id,
    from, to) and paged by `after` (a sequence)."""
    p = request.query_params
    try:
        f = dlq_filter(lambda name: (p.get(name) or "").strip())
        limit, after = _limit(request), sequence(p.get("after") or "0")
    except ValueError as exc:
        return _error(str(exc))
    page = await console_of(request).q.page(f, after, limit)
    return _json({"entries": [e.as_dict(with_body=False) for e in page.entries], "next": page.next_seq})


async def dlq_entry(request: Request) -> JSONResponse:
    """`dlq show --json`: one entry with its headers and body."""
    seq = request.path_params["seq"]
    entry = await console_of(request).q.get(seq)
    if entry is None:
        return _error(f"no DLQ entry {seq} (replayed, purged or aged out)", 404)
    return _json(entry.as_dict())


ROUTES = [
    Route("/api/v1/overview", overview),
    Route("/api/v1/tenants", tenant_list),
    Route("/api/v1/tenants/{tenant}", tenant),
    Route("/api/v1/timers", timer_list),
    Route("/api/v1/timers/{tenant}/{sid:path}", timer),
    Route("/api/v1/dlq", dlq_list),
    Route("/api/v1/dlq/{seq:int}", dlq_entry),
]
