"""The console's door: every request is authenticated, every form post carries its CSRF token.

A browser logs in once (the token, or user and password, compared in constant time) and gets a
random session id in an HttpOnly, SameSite=Strict cookie; the session holds a CSRF token that
each form posts back. A program may send `Authorization: Bearer <token>` instead (no browser sends
that on its own, so it needs no CSRF token). Sessions live in this process: restarting the console
logs everyone out, which for an operator tool is a feature. Behind an identity proxy (oauth2-proxy)
the proxy's header names the user instead, believed only from the proxies configured: ProxyIdentity.

Each identity is an operator or may only read (Roles, TIMER_CONSOLE_OPERATORS): a reader is shown
no action and refused one (base.action_form).

Who someone is comes from the secret that matched and nothing else (Credentials.identity): a user
name is believed only with its password, and a wrong secret beside a right one admits no one.
Wrong guesses (a login's, a bearer token's) are throttled per source in this process (the console
runs as one pod), after the secret is checked: GuessThrottle.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import math
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from worker.config import ConsoleSettings

T = TypeVar("T")
COOKIE = "timer_console"
# The name the token's holder logs in under (TIMER_CONSOLE_OPERATORS may name it); a request that
# carries the token as a bearer is audited as BEARER.
TOKEN_HOLDER = "token"
BEARER = "bearer-token"
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
    user: str  # who logged in, for the audit lines of actions: the user name, or TOKEN_HOLDER
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

    def source(self, request: Request) -> str:
        """Where a guess at a secret comes from (GuessThrottle's key): the client's address; from a
        trusted proxy, the nearest address it forwards (X-Forwarded-For) that is not one itself."""
        peer = request.client.host if request.client else "?"
        if not self.trusted(peer):
            return peer
        hops = ",".join(request.headers.getlist("x-forwarded-for")).split(",")
        for hop in (h.strip() for h in reversed(hops)):
            if hop and not self.trusted(hop):
                try:
                    return str(ipaddress.ip_address(hop))
                except ValueError:
                    return peer
        return peer

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

    def identity(self, token: str = "", user: str = "", password: str = "") -> str | None:
        """Who the secrets given prove to be: the configured user when the password is theirs, else
        the token's holder (TOKEN_HOLDER) when the token is; None when a secret given is wrong, or
        none is given. A user name is no secret: without its password it names no one. Every
        configured secret is compared, whichever was given, so the time taken says nothing."""
        token_ok = self.token is not None and _same(token, self.token)
        password_ok = (
            self.user is not None
            and self.password is not None
            and _same(user, self.user) & _same(password, self.password)
        )
        if (token and not token_ok) or (password and not password_ok):
            return None
        if password:
            return self.user
        return TOKEN_HOLDER if token else None

    def bearer(self, header: str | None) -> bool:
        """Whether the header is `Bearer <the token>`: its holder's request."""
        scheme, _, value = (header or "").partition(" ")
        return scheme.lower() == "bearer" and self.identity(token=value.strip()) == TOKEN_HOLDER


class RequireLogin:
    """ASGI middleware: no route answers without the identity proxy's user, a session or a bearer
    token (a wrong one a guess, throttled). A page asked for by GET is redirected to the login
    form; anything else (a post, the JSON API) gets an empty 401."""

    def __init__(
        self,
        app: ASGIApp,
        sessions: Sessions,
        credentials: Credentials,
        proxy: ProxyIdentity,
        throttle: GuessThrottle,
    ) -> None:
        self.app = app
        self.sessions = sessions
        self.credentials = credentials
        self.proxy = proxy
        self.throttle = throttle

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
        try:
            bearer = session is None and await self._bearer(request)
        except TooManyGuesses as exc:
            await too_many(exc)(scope, receive, send)
            return
        if session is not None:
            scope.setdefault("state", {})["session"] = session
        elif bearer:
            scope.setdefault("state", {})["session"] = None  # a program: no forms, no CSRF
        else:
            page = request.method in ("GET", "HEAD") and not scope["path"].startswith(API)
            response = RedirectResponse("/login", status_code=303) if page else Response(status_code=401)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _bearer(self, request: Request) -> bool:
        """Whether the request carries the token as a bearer: a guess, when it carries another."""
        header = request.headers.get("authorization")
        if header is None:
            return False
        found = await self.throttle.check(
            self.proxy.source(request), lambda: BEARER if self.credentials.bearer(header) else None
        )
        return found is not None


def too_many(exc: TooManyGuesses) -> Response:
    return PlainTextResponse(str(exc), status_code=429, headers={"Retry-After": f"{exc.retry_after_s:.0f}"})


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


class TooManyGuesses(Exception):
    """A source past its free guesses already has MAX_WAITING waiting: refused unchecked."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"too many guesses waiting; retry in {retry_after_s:.0f} s")
        self.retry_after_s = retry_after_s


class GuessThrottle:
    """Wrong guesses at a secret (a login's, a bearer token's), per source (ProxyIdentity.source).
    The secret is always checked first and a right one always gets in. A source's first FREE wrong
    guesses are answered at once; the answer to each further one is held, 1 s doubling up to
    MAX_WAIT_S, and a source's guesses are checked one at a time, so that holding its wrong answers
    slows that source, and no other, to one guess a wait (a right guess sent beside them waits its
    turn: answered at once, it would tell which guesses are wrong without waiting for them).

    A source is forgotten after FORGET_S without a wrong guess; a right secret does not clear it
    (a token holder could otherwise guess at a password between logins). Kept in this process
    (the console runs as one pod), at most MAX_KEYS sources (the oldest go first)."""

    FREE = 10
    MAX_WAIT_S = 60.0
    # Guesses of a source past FREE that may wait their turn: more are refused unchecked (429), so
    # a right secret from that source waits at most this many holds, and no connection piles up.
    MAX_WAITING = 2
    FORGET_S = 3600.0
    MAX_KEYS = 10_000

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.clock, self.sleep = clock, sleep
        # source -> (wrong guesses, when the last one was)
        self._failed: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self._turns: dict[str, _Turn] = {}

    async def check(self, source: str, check: Callable[[], T | None]) -> T | None:
        """`check()` (who the secret names, or None) in this source's turn; a None answered only
        after the source's wait. TooManyGuesses, unchecked, past MAX_WAITING."""
        failures = self._failed.get(source, (0, 0.0))[0]
        if failures >= self.FREE and self.waiting(source) >= self.MAX_WAITING:
            raise TooManyGuesses(max(1.0, self.wait_s(source)))
        async with self._turn(source):
            # A hold cut short (its request cancelled) still holds the guess after it.
            await self._hold(source)
            found = check()
            if found is None:
                self._failed_once(source)
                await self._hold(source)
            return found

    def waiting(self, source: str) -> int:
        """The guesses from this source being checked or waiting their turn."""
        turn = self._turns.get(source)
        return turn.guesses if turn else 0

    def wait_s(self, source: str) -> float:
        """Seconds this source's next guess waits before it is checked (0: none)."""
        failures, last = self._failed.get(source, (0, 0.0))
        now = self.clock()
        if failures <= self.FREE or now - last >= self.FORGET_S:
            return 0.0
        return max(0.0, last + min(self.MAX_WAIT_S, 2.0 ** (failures - self.FREE - 1)) - now)

    async def _hold(self, source: str) -> None:
        wait = self.wait_s(source)
        if wait > 0:
            await self.sleep(wait)

    def _failed_once(self, source: str) -> None:
        now = self.clock()
        failures, last = self._failed.pop(source, (0, now))
        self._failed[source] = (failures + 1 if now - last < self.FORGET_S else 1, now)
        while len(self._failed) > self.MAX_KEYS:
            self._failed.popitem(last=False)

    @contextlib.asynccontextmanager
    async def _turn(self, source: str) -> AsyncIterator[None]:
        turn = self._turns.setdefault(source, _Turn())
        turn.guesses += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.guesses -= 1
            if not turn.guesses:
                del self._turns[source]


@dataclass(slots=True)
class _Turn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    guesses: int = 0
