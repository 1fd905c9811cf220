"""The console's door: every request is authenticated, every form post carries its CSRF token.

A browser logs in once (the token, or user and password, compared in constant time) and gets a
random session id in an HttpOnly, SameSite=Strict cookie; the session holds a CSRF token that
each form posts back. A program may send `Authorization: Bearer <token>` instead (no browser sends
that on its own, so it needs no CSRF token). Sessions live in this process: restarting the console
logs everyone out, which for an operator tool is a feature. Behind an identity proxy (oauth2-proxy)
the proxy's header names the user instead, believed only from the proxies configured: ProxyIdentity.

Each identity is an operator or may only read (Roles, TIMER_CONSOLE_OPERATORS): a reader is shown
no action and refused one (base.action_form).

Failed logins are throttled in this process (the console runs as one pod): LoginThrottle.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from worker.config import ConsoleSettings

COOKIE = "timer_console"
SESSION_TTL_S = 8 * 3600
# Reachable without a session: the login form and its post. Nothing else.
OPEN_PATHS = frozenset({"/login"})
# The JSON API's paths: a program asking without credentials gets 401, not the login form.
API = "/api/"


def _same(given: str, expected: str) -> bool:
    return hmac.compare_digest(given.encode(), expected.encode())


# A user or group name from the proxy's headers, and the groups of one user, at most: beyond,
# the request is refused (a proxy does not send such; a header that long is not its).
MAX_NAME_CHARS = 256
MAX_GROUPS = 100


@dataclass(slots=True)
class Session:
    csrf: str
    expires: float
    user: str  # who logged in, for the audit lines of actions: the user name, or "token"
    operator: bool  # may act (when actions are on); else may only read
    proxied: bool = False  # named by the identity proxy on each request: no login, no logout


class Roles:
    """Who is an operator: the names of TIMER_CONSOLE_OPERATORS, the members of a group of
    TIMER_CONSOLE_OPERATOR_GROUPS; with neither set, everyone who gets in (as before roles)."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.users, self.groups = settings.operator_names, settings.operator_groups

    def operator(self, user: str, groups: frozenset[str] = frozenset()) -> bool:
        if not self.users and not self.groups:
            return True
        return user in self.users or not self.groups.isdisjoint(groups)


def proxied_identity(user: str, groups: str | None) -> tuple[str, frozenset[str]]:
    """The user and groups an identity proxy's headers name; ValueError saying which is not one."""
    name = user.strip()
    if not name or len(name) > MAX_NAME_CHARS or not name.isprintable():
        raise ValueError(
            f"the identity proxy's user header holds no user name of at most {MAX_NAME_CHARS} characters"
        )
    parts = [g.strip() for g in (groups or "").split(",", MAX_GROUPS) if g.strip()]
    if len(parts) > MAX_GROUPS or any(len(g) > MAX_NAME_CHARS or not g.isprintable() for g in parts):
        raise ValueError(
            f"the identity proxy's groups header holds more than {MAX_GROUPS} groups, or one not a name "
            f"of at most {MAX_NAME_CHARS} characters"
        )
    return name, frozenset(parts)


class ProxyIdentity:
    """The user an identity proxy in front authenticated (TIMER_CONSOLE_USER_HEADER), when the
    request comes from one of TIMER_CONSOLE_TRUSTED_PROXIES: from anyone else, and when no header
    is configured, the headers are ignored (any client can send them). Its forms carry a CSRF
    token of its own, an HMAC of the user under a key of this process."""

    def __init__(self, settings: ConsoleSettings, roles: Roles) -> None:
        self.user_header = settings.console_user_header.lower()
        self.groups_header = settings.console_groups_header.lower()
        self.proxies = settings.trusted_proxies
        self.roles = roles
        self._key = secrets.token_bytes(32)

    def trusted(self, address: str | None) -> bool:
        try:
            ip = ipaddress.ip_address(address or "")
        except ValueError:
            return False
        return any(ip in network for network in self.proxies)

    def session(self, request: Request) -> Session | None:
        """The proxy's user as a session, or None (no proxy configured, not from one, no header);
        ValueError when the header names no user."""
        if not self.user_header or not self.trusted(request.client.host if request.client else None):
            return None
        user = request.headers.get(self.user_header)
        if user is None:
            return None
        groups = request.headers.get(self.groups_header) if self.groups_header else None
        name, member_of = proxied_identity(user, groups)
        csrf = hmac.new(self._key, name.encode(), "sha256").hexdigest()
        return Session(csrf, math.inf, name, self.roles.operator(name, member_of), proxied=True)


class Sessions:
    def __init__(self, ttl_s: float = SESSION_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._by_id: dict[str, Session] = {}

    def create(self, user: str, operator: bool) -> str:
        now = time.monotonic()
        self._by_id = {k: v for k, v in self._by_id.items() if v.expires > now}  # forget stale ones
        sid = secrets.token_urlsafe(32)
        self._by_id[sid] = Session(secrets.token_urlsafe(32), now + self.ttl_s, user, operator)
        return sid

    def get(self, sid: str | None) -> Session | None:
        session = self._by_id.get(sid) if sid else None
        if session is None or session.expires <= time.monotonic():
            return None
        return session

    def drop(self, sid: str | None) -> None:
        if sid:
            self._by_id.pop(sid, None)


class Credentials:
    def __init__(self, settings: ConsoleSettings) -> None:
        self.token = settings.console_token.get_secret_value() if settings.console_token else None
        self.user = settings.console_user
        self.password = settings.console_password.get_secret_value() if settings.console_password else None

    def admits(self, token: str = "", user: str = "", password: str = "") -> bool:
        """Whether the token, or the user and password, are the configured ones. Every configured
        secret is compared, whichever was given, so the time taken says nothing about which failed."""
        ok = False
        if self.token is not None:
            ok |= _same(token, self.token) and bool(token)
        if self.user is not None and self.password is not None:
            ok |= _same(user, self.user) & _same(password, self.password) and bool(user)
        return ok

    def who(self, token: str = "", user: str = "") -> str:
        """The name an admitted login is audited under."""
        return user if user and self.user is not None and _same(user, self.user) else "token"

    def bearer(self, header: str | None) -> bool:
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "bearer" and self.admits(token=value.strip())


class RequireLogin:
    """ASGI middleware: no route answers without the identity proxy's user, a session or a bearer
    token. A page asked for by GET is redirected to the login form; anything else (a post, the JSON
    API) gets an empty 401."""

    def __init__(
        self, app: ASGIApp, sessions: Sessions, credentials: Credentials, proxy: ProxyIdentity
    ) -> None:
        self.app = app
        self.sessions = sessions
        self.credentials = credentials
        self.proxy = proxy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            session = self.proxy.session(request) or self.sessions.get(request.cookies.get(COOKIE))
        except ValueError as exc:  # the proxy's header, malformed: one line, no session
            await PlainTextResponse(str(exc), status_code=400)(scope, receive, send)
            return
        if session is not None:
            scope.setdefault("state", {})["session"] = session
        elif self.credentials.bearer(request.headers.get("authorization")):
            scope.setdefault("state", {})["session"] = None  # a program: no forms, no CSRF
        else:
            page = request.method in ("GET", "HEAD") and not scope["path"].startswith(API)
            response = RedirectResponse("/login", status_code=303) if page else Response(status_code=401)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def csrf_ok(request: Request, posted: object) -> bool:
    """A form post from a session carries that session's CSRF token; a bearer request needs none."""
    session: Session | None = request.state.session
    if session is None:
        return True
    return isinstance(posted, str) and _same(posted, session.csrf)


def served_over_tls(request: Request) -> bool:
    """Whether the browser reached us over HTTPS: directly, or through a proxy that ended TLS and
    says so (X-Forwarded-Proto, Forwarded: proto=https; the chart's Ingress does). The headers are
    not checked against a list of proxies: they only ever add Secure to the cookie, and a client
    that lies about them only keeps its own cookie from being sent back over plain HTTP."""
    if request.url.scheme == "https":
        return True
    forwarded_proto = request.headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    forwarded = request.headers.get("forwarded", "").split(",")[0].lower().replace(" ", "")
    return forwarded_proto == "https" or "proto=https" in forwarded.split(";")


class LoginThrottle:
    """Failed logins, per client address and per user name: after FREE failures a key must wait
    before its next try, 1 s doubling with each further failure up to MAX_WAIT_S. A success clears
    both of its keys; a key forgotten after FORGET_S without failures. Kept in this process (the
    console runs as one pod), at most MAX_KEYS keys (the oldest go first).

    Behind a proxy every client has the proxy's address: the address key then throttles everyone
    together, which is why its allowance is the larger one."""

    FREE_PER_USER = 5
    FREE_PER_ADDRESS = 20
    MAX_WAIT_S = 300.0
    FORGET_S = 3600.0
    MAX_KEYS = 10_000

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # key -> (failures, when the last one was)
        self._failed: OrderedDict[str, tuple[int, float]] = OrderedDict()

    @staticmethod
    def keys(address: str, user: str) -> list[tuple[str, int]]:
        return [
            (f"addr:{address}", LoginThrottle.FREE_PER_ADDRESS),
            (f"user:{user or 'token'}", LoginThrottle.FREE_PER_USER),
        ]

    def wait_s(self, address: str, user: str) -> float:
        """Seconds before this address or user may try again (0: now)."""
        now, longest = self.clock(), 0.0
        for key, free in self.keys(address, user):
            failures, last = self._failed.get(key, (0, 0.0))
            if failures >= free and now - last < self.FORGET_S:
                wait = min(self.MAX_WAIT_S, 2.0 ** (failures - free))
                longest = max(longest, last + wait - now)
        return max(0.0, longest)

    def failed(self, address: str, user: str) -> None:
        now = self.clock()
        for key, _ in self.keys(address, user):
            failures, last = self._failed.pop(key, (0, now))
            self._failed[key] = (failures + 1 if now - last < self.FORGET_S else 1, now)
        while len(self._failed) > self.MAX_KEYS:
            self._failed.popitem(last=False)

    def succeeded(self, address: str, user: str) -> None:
        for key, _ in self.keys(address, user):
            self._failed.pop(key, None)

    @staticmethod
    def retry_after(wait_s: float) -> str:
        return str(max(1, math.ceil(wait_s)))
