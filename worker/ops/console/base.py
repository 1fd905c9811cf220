"""What every page of the console shares: the Console (settings, sessions, connections, the
cached counts), rendering (templates, times, the live region), the CSRF-checked form, the gate
in front of every action and its audit line."""

from __future__ import annotations

import json
import logging
import secrets
import time
import urllib.parse
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import jinja2
from markupsafe import Markup
from nats.aio.client import Client as NATS
from starlette.concurrency import run_in_threadpool
from starlette.convertors import Convertor, register_url_convertor
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from worker.client import TimerClient
from worker.config import ConsoleSettings
from worker.contract import MAX_ID_CHARS, TENANT_RULE
from worker.core.fields import label_problem
from worker.core.timers import due_and_planned
from worker.ops import dlq, reads
from worker.ops.console.auth import (
    BEARER,
    TOKEN_HOLDER,
    Credentials,
    GuessThrottle,
    ProxyIdentity,
    Roles,
    Sessions,
    csrf_ok,
)


class _Part(Convertor[str]):
    """A path part the routes take only when it can name something: any other answers 404, never
    a database error (a NUL, say)."""

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


class _TenantPart(_Part):
    regex = TENANT_RULE


class _IdPart(_Part):  # the id rule (core/fields.py): no control character, at most MAX_ID_CHARS
    regex = f"[^\\x00-\\x1f\\x7f-\\x9f]{{1,{MAX_ID_CHARS}}}"


register_url_convertor("tenant", _TenantPart())
register_url_convertor("sid", _IdPart())

log = logging.getLogger(__name__)
T = TypeVar("T")

# The counts that read the whole table (timers by state, top tenants) are read at most this often;
# every page in between shows them with their age. Everything else is read on each look.
COUNTS_TTL_S = 30.0
# How often a page's live region is fetched again while the page is visible.
LIVE_EVERY_S = 5


def _csp(nonce: str) -> str:
    # The one script is inline and carries this response's nonce; it may fetch this origin only.
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; connect-src 'self'; style-src 'unsafe-inline'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


def headers(nonce: str = "") -> dict[str, str]:
    return {
        "Cache-Control": "no-store",
        "Content-Security-Policy": _csp(nonce or secrets.token_urlsafe(16)),
        "Referrer-Policy": "no-referrer",
        "X-Content-Type-Options": "nosniff",
    }


def fmt_time(value: object) -> Markup | str:
    """A time as the contract writes it (reads.fmt_time), in a <time> the page's script shows in
    the reader's zone and relative to now. Takes a datetime or the contract's string form."""
    text = reads.fmt_time(value) if isinstance(value, datetime) else value
    if not text:
        return "-"
    return Markup('<time datetime="{0}">{0}</time>').format(text)


def fmt_due(row: dict[str, Any]) -> Markup | str:
    """A listed timer's dueAt, and beside it, with a firing window, the instant it is planned to
    fire: as `get` and `timer-service list` show them (worker/core/timers.py, due_and_planned)."""
    due, planned = due_and_planned(row["due_at"], row["nominal_due_at"])
    if planned is None:
        return fmt_time(due)
    return Markup("{0} <small>planned {1}</small>").format(fmt_time(due), fmt_time(planned))


def fmt_value(value: object) -> Markup | str:
    """A value on a page: never Python's None, True or False, nor a dict's repr."""
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, dict):
        return ", ".join(f"{k} {fmt_value(v)}" for k, v in value.items() if v is not None) or "-"
    if isinstance(value, list):
        return json.dumps(value)
    return str(value)


def fmt_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 1:
        return f"{value * 1000:.1f} ms"
    return f"{value:.1f} s" if value < 120 else f"{value / 60:.1f} min"


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)

_env.filters["q"] = lambda value: urllib.parse.quote(str(value), safe="")
_env.filters["t"] = fmt_time
_env.filters["due"] = fmt_due
_env.filters["v"] = fmt_value
_env.filters["secs"] = fmt_seconds


class Console:
    def __init__(self, settings: ConsoleSettings) -> None:
        self.s = settings
        self.conninfo = settings.database_url.get_secret_value()
        self.sessions = Sessions()
        self.credentials = Credentials(settings)
        self.roles = Roles(settings)
        self.proxy = ProxyIdentity(settings, self.roles)
        self.throttle = GuessThrottle()
        self.nc: NATS | None = None
        self.queue: dlq.Dlq | None = None
        self.client: TimerClient | None = None
        self._counts: tuple[float, dict[str, Any]] | None = None
        self._kept: dict[Any, tuple[float, Any]] = {}

    async def db(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(conn, *args)` on a one-off read-only connection, off the event loop."""

        def run() -> T:
            with reads.connect(self.conninfo) as conn:
                return fn(conn, *args)

        return await run_in_threadpool(run)

    async def counts(self) -> tuple[dict[str, Any], float]:
        """(timers by state and top tenants, their age in seconds): read again past COUNTS_TTL_S."""
        now = time.monotonic()
        if self._counts is None or now - self._counts[0] > COUNTS_TTL_S:
            self._counts = (now, await self.db(reads.fleet_counts))
        return self._counts[1], now - self._counts[0]

    async def kept(self, key: Any, ttl_s: float, fn: Callable[..., T], *args: Any) -> T:
        """`self.db(fn, *args)`, read again past `ttl_s` only: for reads dearer than a look is
        worth, under a few fixed keys (the dict grows by the keys its callers use, no further)."""
        now = time.monotonic()
        hit = self._kept.get(key)
        if hit is None or now - hit[0] > ttl_s:
            hit = self._kept[key] = (now, await self.db(fn, *args))
        result: T = hit[1]
        return result

    @property
    def q(self) -> dlq.Dlq:
        assert self.queue is not None, "the console's lifespan opens the DLQ"
        return self.queue

    def page(self, request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        """The page, or only its live region when the page's script asks for it (?live=1)."""
        session = getattr(request.state, "session", None)
        nonce = secrets.token_urlsafe(16)
        ctx = {
            "csrf": session.csrf if session else "",
            "actions": may_act(request),
            "actions_on": self.s.console_actions,
            "user": session.user if session else None,
            "logout": session is not None and not session.proxied,
            "nonce": nonce,
            "live_every_s": LIVE_EVERY_S,
            **context,
        }
        tpl = _env.get_template(template)
        if request.query_params.get("live") == "1" and "live" in tpl.blocks:
            html = "".join(tpl.blocks["live"](tpl.new_context(ctx)))
        else:
            html = tpl.render(ctx)
        return HTMLResponse(html, status_code=status_code, headers=headers(nonce))


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


async def checked_form(request: Request) -> FormData:
    """The posted form, when it carries the session's CSRF token (a bearer request needs none);
    403 otherwise. Every post goes through here."""
    form = await request.form()
    if not csrf_ok(request, form.get("csrf")):
        raise HTTPException(403, "the form's CSRF token is missing or not this session's")
    return form


def field(form: FormData, name: str) -> str:
    value = form.get(name)
    return value.strip() if isinstance(value, str) else ""


async def action_form(request: Request) -> FormData:
    """An action's form: CSRF-checked, and refused unless TIMER_CONSOLE_ACTIONS is on and the
    user is an operator."""
    form = await checked_form(request)
    if not console_of(request).s.console_actions:
        raise HTTPException(403, "actions are off (TIMER_CONSOLE_ACTIONS)")
    if not may_act(request):
        raise HTTPException(403, f"{who(request)} may only read: not an operator (TIMER_CONSOLE_OPERATORS)")
    return form


def may_act(request: Request) -> bool:
    """Actions are on and this is an operator's request. A bearer request is the token's holder."""
    c = console_of(request)
    session = getattr(request.state, "session", None)
    operator = session.operator if session is not None else c.roles.operator(TOKEN_HOLDER)
    return c.s.console_actions and operator


def who(request: Request) -> str:
    session = getattr(request.state, "session", None)
    return session.user if session is not None else BEARER


def audit(request: Request, what: str, tenant: str | None, id: str | None, **detail: Any) -> None:
    """One `console_action` line per action taken: who, from where, on what, with what outcome."""
    log.info(
        f"console action {what}",
        extra={
            "action": "console_action",
            "user": who(request),
            "client": request.client.host if request.client else None,
            "what": what,
            "tenant": tenant,
            "id": id,
            **detail,
        },
    )


def label_filter(pairs: list[str]) -> dict[str, str] | None:
    """The `label` parameters (`key=value` each) as labels: None without any, {} for a bad one (a
    pair the service's rule refuses, a key twice)."""
    if not pairs:
        return None
    labels = {key: value for key, _, value in (pair.partition("=") for pair in pairs)}
    if len(labels) < len(pairs) or any("=" not in pair for pair in pairs) or label_problem(labels):
        return {}
    return labels
