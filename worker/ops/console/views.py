"""The console's reading pages: the overview, the search, a tenant's timers and a timer's page."""

from __future__ import annotations

import urllib.parse
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors
import psycopg
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from worker.contract import TENANT_RE
from worker.core.fields import identifier_problem
from worker.ops import browse, dlq, fleet, fleet_stats, history, reads
from worker.ops.console import bulk
from worker.ops.console.base import Console, checked_form, console_of, field, headers, label_filter
from worker.ops.console.charts import overview_charts

# The DLQ entries of a tenant read for the ones naming a timer, on the timer's page; the page
# says when the scan stopped there. DLQ entries naming one timer shown at most.
TIMER_DLQ_SCAN = dlq.MAX_SCAN
TIMER_DLQ_SHOWN = 50


# A longer range's charts are read again at most this often, not on each look (every 5 s while the
# page is open): their points are 4 to 85 minutes wide, and a week of three replicas' minutes took
# 0.4 s to add up.
CHART_TTL_S = 60.0


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _overview_reads(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    minutes = fleet_stats.series(conn)
    return {
        "now": reads.fleet_now(conn),
        "late": fleet_stats.lateness(minutes, datetime.now(UTC)),  # the chart's, added up
        "minutes": minutes,
        "replicas": fleet_stats.replicas_seen(conn),
    }


async def overview_data(c: Console, window_min: int = fleet_stats.RANGES["1h"]) -> dict[str, Any]:
    """What the overview shows: the cached counts and their age, the bounded reads of each look,
    the chart's minutes over `window_min`, the command backlog (None when NATS does not say)."""
    counts, counted_s = await c.counts()
    found = await c.db(_overview_reads)  # the last hour: its chart, and the lateness card's minutes
    if window_min != fleet_stats.RANGES["1h"]:
        found["minutes"] = await c.kept(("series", window_min), CHART_TTL_S, fleet_stats.series, window_min)
    backlog = None
    if c.nc is not None:
        try:
            running = sum(1 for r in found["replicas"] if r["alive"])
            backlog = await fleet.command_backlog(c.nc.jetstream(timeout=2), c.s, running)
        except (nats.errors.Error, TimeoutError):
            backlog = None
    return {"counts": counts, "counted_s": counted_s, "backlog": backlog, **found}


async def overview(request: Request) -> Response:
    c = console_of(request)
    chosen = request.query_params.get("range") or "1h"
    if chosen not in fleet_stats.RANGES:
        known = ", ".join(fleet_stats.RANGES)
        return Response(f"bad range: one of {known}", status_code=400, headers=headers())
    window_min = fleet_stats.RANGES[chosen]
    found = await overview_data(c, window_min)
    now = datetime.now(UTC)
    return c.page(
        request,
        "overview.html",
        charts=overview_charts(found.pop("minutes"), (now - timedelta(minutes=window_min), now)),
        ranges=list(fleet_stats.RANGES),
        chosen=chosen,
        step_min=fleet_stats.step_for(window_min),
        **found,
    )


async def search(request: Request) -> Response:
    """A posted search (so the text stays out of URLs and access logs): a tenant goes to its page,
    a tenant and serviceCallId to the timer's; text alone is looked up across tenants, as a
    serviceCallId and as a correlationId, and the matches are listed here."""
    c = console_of(request)
    form = await checked_form(request)
    tenant, text = field(form, "tenant"), field(form, "id")
    if tenant and not TENANT_RE.match(tenant):
        return RedirectResponse("/?bad=tenant", status_code=303)
    if tenant:
        where = f"/timers/{_q(tenant)}/{_q(text)}" if text else f"/tenants/{_q(tenant)}"
        return RedirectResponse(where, status_code=303)
    if not text:
        return RedirectResponse("/", status_code=303)
    if identifier_problem(text, "id") is not None:  # it names no timer: nothing to look up
        return c.page(request, "found.html", text=text, rows=[], most=browse.FOUND_MAX)
    rows = await c.db(browse.find, text)
    if len(rows) == 1:
        r = rows[0]
        return RedirectResponse(f"/timers/{_q(r['tenant_id'])}/{_q(r['service_call_id'])}", status_code=303)
    return c.page(request, "found.html", text=text, rows=rows, most=browse.FOUND_MAX)


def tenant_query(p: QueryParams) -> tuple[str | None, str, dict[str, str] | None]:
    """(state, sort, labels) a tenant's listing is asked for; ValueError naming a bad one."""
    state = p.get("state") or None
    sort = p.get("sort") or "id"
    labels = label_filter([v for v in p.getlist("label") if v])
    if state not in (None, *reads.STATES) or sort not in browse.SORTS or labels == {}:
        raise ValueError("bad filter")
    if labels and sort.endswith("due"):
        sort = "id"  # a label selects in key order (the labels index, or the key range)
    if sort.endswith("due"):
        state = "Scheduled"  # the due index holds Scheduled timers only
    return state, sort, labels


async def tenant(request: Request) -> Response:
    c = console_of(request)
    tenant = request.path_params["tenant"]
    p = request.query_params
    try:
        state, sort, labels = tenant_query(p)
    except ValueError as exc:
        return Response(str(exc), status_code=400, headers=headers())
    summary = await c.db(reads.tenant_summary, tenant)
    try:
        page = await c.db(
            browse.tenant_page, tenant, state, sort, p.get("after"), p.get("before"), 50, labels
        )
    except ValueError:
        return Response("bad cursor", status_code=400, headers=headers())
    total = summary["counts"][state] if state else sum(summary["counts"].values())
    return c.page(
        request, "tenant.html", summary=summary, page=page, state=state, sort=sort, total=total,
        done=request.query_params.get("done"), labels=labels or {},
        bulk=await bulk.offer(request, summary, labels, state),
    )  # fmt: skip


async def timer(request: Request) -> Response:
    c = console_of(request)
    tenant, sid = request.path_params["tenant"], request.path_params["sid"]
    found = await c.db(reads.described, tenant, sid)
    view = None if found is None else found.view
    rejected, cut_at = await _rejected(request, tenant, sid)
    fired = None
    if found is not None and c.nc is not None:
        since = found.timer.registered_at
        try:
            fired = await history.firings(
                c.nc.jetstream(timeout=5), c.s.event_stream, c.s.subject_prefix, tenant, sid, since
            )
        except (nats.errors.Error, TimeoutError):
            fired = None
    return c.page(
        request,
        "timer.html",
        200 if view else 404,
        tenant=tenant,
        sid=sid,
        view=view,
        rejected=rejected,
        cut_at=cut_at,
        scan=TIMER_DLQ_SCAN,
        history=fired,
        done=request.query_params.get("done"),
    )


async def _rejected(request: Request, tenant: str, sid: str) -> tuple[list[dlq.DlqEntry], int | None]:
    """This tenant's DLQ entries naming exactly this serviceCallId (the DLQ's --id filter), and
    the sequence the scan stopped at when it read TIMER_DLQ_SCAN entries without reaching the end."""
    if not TENANT_RE.match(tenant):
        return [], None
    f = dlq.DlqFilter(tenant=tenant, service_call_id=sid)
    page = await console_of(request).q.page(f, limit=TIMER_DLQ_SHOWN, max_scan=TIMER_DLQ_SCAN)
    cut = page.next_seq if page.next_seq is not None and len(page.entries) < TIMER_DLQ_SHOWN else None
    return page.entries, cut
