"""The web console (`timer-service console`): server-rendered pages over worker.ops.reads and
worker.ops.dlq. Read-only unless TIMER_CONSOLE_ACTIONS; every route behind worker.ops.console.auth.

URLs carry ids only (tenant ids, serviceCallIds, DLQ sequences, state names, cursors of ids):
searches are posted, so access logs hold nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import urllib.parse
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import jinja2
import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from worker.config import ConsoleSettings
from worker.contract import TENANT_RE
from worker.ops import dlq, reads
from worker.ops.console.auth import COOKIE, Credentials, RequireLogin, Sessions, csrf_ok

T = TypeVar("T")
# The DLQ entries of a tenant scanned for the ones that name a timer, on the timer's page.
TIMER_DLQ_SCAN = 1000
HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)
_env.filters["q"] = lambda value: urllib.parse.quote(str(value), safe="")
_env.filters["t"] = lambda v: reads.fmt_time(v) if isinstance(v, datetime) else (v or "-")


async def _checked_form(request: Request) -> FormData | None:
    """A post's form, or None when it lacks its session's CSRF token (the caller answers 403)."""
    form = await request.form()
    return form if csrf_ok(request, form.get("csrf")) else None


class Console:
    def __init__(self, settings: ConsoleSettings) -> None:
        self.s = settings
        self.conninfo = settings.database_url.get_secret_value()
        self.sessions = Sessions()
        self.credentials = Credentials(settings)
        self.queue: dlq.Dlq | None = None

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on a one-off read-only connection, off the event loop."""

        def run() -> T:
            with reads.connect(self.conninfo) as conn:
                return fn(conn, *args)

        return await run_in_threadpool(run)

    @property
    def q(self) -> dlq.Dlq:
        assert self.queue is not None, "the console's lifespan opens the DLQ"
        return self.queue

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        session = getattr(request.state, "session", None)
        html = _env.get_template(template).render(
            csrf=session.csrf if session else "", actions=self.s.console_actions, **context
        )
        return HTMLResponse(html, status_code=status_code, headers=HEADERS)

    # --- login -------------------------------------------------------------------------------
    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return self.page(request, "login.html", error=None, basic=bool(self.s.console_user))
        body = await _small_body(request, LOGIN_MAX_BYTES)
        if body is None:
            return Response(status_code=413, headers=HEADERS)
        form = urllib.parse.parse_qs(body.decode("utf-8", "replace"), max_num_fields=10)
        fields = {k: (form.get(k) or [""])[0] for k in ("token", "user", "password")}
        if not self.credentials.admits(**fields):
            return self.page(
                request, "login.html", 401, error="not recognised", basic=bool(self.s.console_user)
            )
        response = RedirectResponse("/", status_code=303, headers=HEADERS)
        response.set_cookie(
            COOKIE,
            self.sessions.create(),
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(self, request: Request) -> Response:
        if await _checked_form(request) is None:
            return Response(status_code=403)
        self.sessions.drop(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(COOKIE)
        return response

    # --- timers ------------------------------------------------------------------------------
    async def overview(self, request: Request) -> Response:
        report = await run_in_threadpool(reads.overview, self.conninfo)
        late = await self.db(reads.lateness)
        return self.page(request, "overview.html", report=report, late=late)

    async def search(self, request: Request) -> Response:
        if (form := await _checked_form(request)) is None:
            return Response(status_code=403)
        tenant = str(form.get("tenant") or "").strip()
        sid = str(form.get("id") or "").strip()
        if not TENANT_RE.match(tenant):
            return RedirectResponse("/?bad=tenant", status_code=303)
        where = f"/timers/{_q(tenant)}/{_q(sid)}" if sid else f"/tenants/{_q(tenant)}"
        return RedirectResponse(where, status_code=303)

    async def tenant(self, request: Request) -> Response:
        tenant = request.path_params["tenant"]
        p = request.query_params
        try:
            f = reads.TimerFilter(
                tenant_id=tenant, state=p.get("state") or None, overdue=p.get("overdue") == "1"
            )
        except ValueError:
            return Response("bad filter", status_code=400, headers=HEADERS)
        summary = await self.db(reads.tenant_summary, tenant)
        try:
            page = await self.db(reads.list_timers, f, p.get("after") or None, 50)
        except ValueError:
            return Response("bad cursor", status_code=400, headers=HEADERS)
        return self.page(request, "tenant.html", summary=summary, page=page, f=f)

    async def timer(self, request: Request) -> Response:
        tenant, sid = request.path_params["tenant"], request.path_params["sid"]
        view = await self.db(reads.describe, tenant, sid)
        rejected = await self._rejected(tenant, sid)
        return self.page(
            request, "timer.html", 200 if view else 404, tenant=tenant, sid=sid, view=view, rejected=rejected
        )

    async def _rejected(self, tenant: str, sid: str) -> list[dlq.DlqEntry]:
        """This tenant's DLQ entries whose body names the timer (among the first TIMER_DLQ_SCAN)."""
        if not TENANT_RE.match(tenant):
            return []
        f = dlq.DlqFilter(tenant=tenant)
        page = await self.q.page(f, limit=TIMER_DLQ_SCAN, max_scan=TIMER_DLQ_SCAN)
        needle = json.dumps(sid)[1:-1].encode()  # as it appears inside a JSON string
        return [e for e in page.entries if needle in e.body]

    # --- DLQ ---------------------------------------------------------------------------------
    async def dlq_list(self, request: Request) -> Response:
        p = request.query_params
        tenant = p.get("tenant") or None
        if tenant is not None and not TENANT_RE.match(tenant):
            return Response("bad tenant", status_code=400, headers=HEADERS)
        f = dlq.DlqFilter(tenant=tenant, reason=p.get("reason") or None)
        after = int(p["after"]) if p.get("after", "").isdigit() else 0
        page = await self.q.page(f, after, 50)
        return self.page(request, "dlq.html", page=page, f=f)

    async def dlq_entry(self, request: Request) -> Response:
        seq = request.path_params["seq"]
        entry = await self.q.get(seq)
        if entry is None:
            return self.page(request, "gone.html", 404, seq=seq)
        return self.page(request, "dlq_entry.html", e=entry, error=None, body=entry.body_text())

    async def dlq_replay(self, request: Request) -> Response:
        seq = request.path_params["seq"]
        if (form := await _checked_form(request)) is None:
            return Response(status_code=403)
        if not self.s.console_actions:
            return Response("actions are off (TIMER_CONSOLE_ACTIONS)", status_code=403, headers=HEADERS)
        entry = await self.q.get(seq)
        if entry is None:
            return self.page(request, "gone.html", 404, seq=seq)
        posted = form.get("body")
        body = str(posted).replace("\r\n", "\n").encode() if isinstance(posted, str) else None
        edited = body if body is not None and body != entry.body else None
        try:
            done = await self.q.replay(seq, edited)
        except dlq.ReplayRefused as exc:
            return self.page(request, "dlq_entry.html", 422, e=entry, error=str(exc), body=posted)
        if done is None:
            return self.page(request, "gone.html", 404, seq=seq)
        return self.page(request, "replayed.html", done=done, timer=dlq.command_key(edited or entry.body))


# /login answers anyone: its body (a urlencoded form of credentials) is read up to this, no further.
LOGIN_MAX_BYTES = 8192


async def _small_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None when it is longer than `limit` (declared or streamed), read no
    further. Starlette's form parser holds up to 1,000 fields of 1 MiB and spools uploads to disk."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def create_app(settings: ConsoleSettings) -> Starlette:
    console = Console(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Give up on a NATS that is not there (the replicas' default is to wait forever).
        async with dlq.open_dlq(settings, max_reconnect_attempts=60) as queue:
            console.queue = queue
            yield

    routes = [
        Route("/login", console.login, methods=["GET", "POST"]),
        Route("/logout", console.logout, methods=["POST"]),
        Route("/", console.overview),
        Route("/search", console.search, methods=["POST"]),
        Route("/tenants/{tenant}", console.tenant),
        Route("/timers/{tenant}/{sid:path}", console.timer),
        Route("/dlq", console.dlq_list),
        Route("/dlq/{seq:int}", console.dlq_entry),
        Route("/dlq/{seq:int}/replay", console.dlq_replay, methods=["POST"]),
    ]
    middleware = [Middleware(RequireLogin, sessions=console.sessions, credentials=console.credentials)]
    return Starlette(routes=routes, middleware=middleware, lifespan=lifespan)


async def _reachable(settings: ConsoleSettings) -> None:
    """Postgres and NATS answer: checked before serving, so a wrong URL is one line, not a traceback."""

    def database() -> None:
        with reads.connect(settings.database_url.get_secret_value()) as conn:
            conn.execute("SELECT 1")

    await run_in_threadpool(database)
    async with dlq.open_dlq(settings, allow_reconnect=False, max_reconnect_attempts=1):
        pass


def serve(settings: ConsoleSettings) -> None:
    """Run until interrupted. Plain HTTP: put TLS in front of it (or an SSH tunnel) off localhost."""
    asyncio.run(_reachable(settings))
    uvicorn.run(
        create_app(settings),
        host=settings.console_host,
        port=settings.console_port,
        log_config=None,  # the service's own log setup (worker.logs)
        server_header=False,
    )
