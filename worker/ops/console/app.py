"""The web console (`timer-service console`): server-rendered pages over worker.ops (reads,
browse, stats, history, dlq). Read-only unless TIMER_CONSOLE_ACTIONS, and then for every user
but the operators (TIMER_CONSOLE_OPERATORS); every route behind worker.ops.console.auth. The
pages: views.py (overview, search, tenant, timer), tenant_views.py (every tenant), dlq_views.py,
actions.py (a timer's and a tenant's actions), bulk.py (the actions on the timers a filter
selects); their data as JSON: api.py; what they share: base.py.

URLs carry ids only (tenant ids and prefixes, serviceCallIds, DLQ sequences, state names, reason
codes, the DLQ filter's times, cursors of ids): searches are posted, so access logs hold nothing
else.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import urllib.parse
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from worker.adapters.jetstream.options import connect_options
from worker.client import TimerClient
from worker.client.wire import nats_connect
from worker.config import ConsoleSettings
from worker.errors import ConfigError
from worker.ops import dlq, reads
from worker.ops.console import actions, api, bulk, dlq_views, tenant_views, views
from worker.ops.console.auth import COOKIE, RequireLogin, TooManyGuesses, served_over_tls, too_many
from worker.ops.console.base import Console, checked_form, console_of, headers

# /login answers anyone: its body (a urlencoded form of credentials) is read up to this, no further.
LOGIN_MAX_BYTES = 8192


async def login(request: Request) -> Response:
    c = console_of(request)
    basic = bool(c.s.console_user)
    if request.method == "GET":
        return c.page(request, "login.html", error=None, basic=basic)
    body = await _small_body(request, LOGIN_MAX_BYTES)
    if body is None:
        return Response(status_code=413, headers=headers())
    form = urllib.parse.parse_qs(body.decode("utf-8", "replace"), max_num_fields=10)
    fields = {k: (form.get(k) or [""])[0] for k in ("token", "user", "password")}
    try:
        user = await c.throttle.check(c.proxy.source(request), lambda: c.credentials.identity(**fields))
    except TooManyGuesses as exc:
        return too_many(exc)
    if user is None:
        return c.page(request, "login.html", 401, error="not recognised", basic=basic)
    response = RedirectResponse("/", status_code=303, headers=headers())
    response.set_cookie(
        COOKIE,
        c.sessions.create(user, c.roles.operator(user)),
        httponly=True,
        samesite="strict",
        secure=served_over_tls(request),
    )
    return response


async def logout(request: Request) -> Response:
    await checked_form(request)
    console_of(request).sessions.drop(request.cookies.get(COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE)
    return response


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


def create_app(settings: ConsoleSettings) -> Starlette:
    console = Console(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Give up on a NATS that is not there (the replicas' default is to wait forever).
        opts = connect_options(settings) | {"max_reconnect_attempts": 60}
        nc = await nats_connect(opts.pop("servers"), **opts)
        console.nc, console.queue = nc, dlq.Dlq(nc, settings)
        console.client = TimerClient(nc, settings.subject_prefix)
        try:
            yield
        finally:
            await nc.close()

    routes = [
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", views.overview),
        Route("/search", views.search, methods=["POST"]),
        Route("/tenants", tenant_views.tenant_list),
        Route("/tenants/{tenant:tenant}", views.tenant),
        Route("/timers/{tenant:tenant}/{sid:sid}", views.timer),
        Route("/act/{what}/{tenant:tenant}/{sid:sid}", actions.timer_action, methods=["POST"]),
        Route("/act-tenant/{what}/{tenant:tenant}", actions.tenant_action, methods=["POST"]),
        Route("/act-labelled/{what}/{tenant:tenant}", bulk.labelled_action, methods=["POST"]),
        Route("/dlq", dlq_views.dlq_list),
        Route("/dlq/bulk", dlq_views.dlq_bulk, methods=["POST"]),
        Route("/dlq/{seq:int}", dlq_views.dlq_entry),
        Route("/dlq/{seq:int}/replay", dlq_views.dlq_replay, methods=["POST"]),
        *api.ROUTES,
    ]
    middleware = [
        Middleware(
            RequireLogin,
            sessions=console.sessions,
            credentials=console.credentials,
            proxy=console.proxy,
            throttle=console.throttle,
        )
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.console = console
    app.state.confirmations = bulk.Confirmations()
    return app


async def _reachable(settings: ConsoleSettings) -> None:
    """Postgres and NATS answer: checked before serving, so a wrong URL is one line, not a traceback."""

    def database() -> None:
        with reads.connect(settings.database_url.get_secret_value()) as conn:
            conn.execute("SELECT 1")

    await run_in_threadpool(database)
    async with dlq.open_dlq(settings, allow_reconnect=False, max_reconnect_attempts=1):
        pass


def listen(host: str, port: int) -> socket.socket:
    """The console's socket, bound here rather than by uvicorn: a port in use is one line of ours
    (uvicorn would log it as a JSON line carrying its ANSI-coloured twin, then exit)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = (
            "in use (another console, or a replica's metrics port?)"
            if exc.errno == errno.EADDRINUSE
            else exc.strerror
        )
        raise ConfigError(f"the console cannot listen on {host}:{port} (TIMER_CONSOLE_PORT): {why}") from None
    sock.set_inheritable(True)
    return sock


def serve(settings: ConsoleSettings) -> None:
    """Run until interrupted. Plain HTTP: put TLS in front of it (or an SSH tunnel) off localhost."""
    sock = listen(settings.console_host, settings.console_port)
    asyncio.run(_reachable(settings))
    config = uvicorn.Config(
        create_app(settings),
        log_config=None,  # the service's own log setup (worker.logs)
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[sock])
