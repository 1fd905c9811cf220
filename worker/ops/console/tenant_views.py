"""The console's tenants page: every tenant, 50 a page, by name or by pending timers, searched by
the start of its id (worker/ops/tenants.py). A bad sort, prefix or cursor is one line on the page."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import Response

from worker.ops import tenants
from worker.ops.console.base import console_of

PAGE = 50


def tenant_query(params: QueryParams) -> dict[str, Any]:
    """The listing the query's `sort`, `prefix` and `after` name (checked by tenants.tenants_page)."""
    return {
        "sort": params.get("sort") or "name",
        "prefix": (params.get("prefix") or "").strip(),
        "after": params.get("after") or None,
    }


async def tenant_list(request: Request) -> Response:
    c = console_of(request)
    q = tenant_query(request.query_params)
    counts, _ = await c.counts()
    shared = {"total": counts["tenant_count"], "walk": tenants.MAX_WALK, "first": q["after"] is None}
    try:
        page = await c.db(tenants.tenants_page, q["sort"], q["prefix"], q["after"], PAGE)
    except ValueError as exc:
        return c.page(
            request, "tenants.html", 400, error=str(exc), page=None, sort="name", prefix="", **shared
        )
    return c.page(
        request, "tenants.html", error=None, page=page, sort=q["sort"], prefix=q["prefix"], **shared
    )
