"""Who the console takes someone for (worker/ops/console/auth.py), on every route of its own route
table, for every form credentials take: the identity recorded (the page's name, the audit line,
the refusal) and the rights given are those of the secret that matched, and a wrong secret, beside
a right one or instead of it, never changes who someone is. One console, over HTTP, per module."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn

from tests.helpers import until
from tests.integration.ops.test_console import TOKEN, _reject, _streams, console_settings
from tests.integration.ops.test_console_tenants import _seed
from tests.servers import Servers, delete_streams, fresh_database, own_names
from worker.config import ConsoleSettings
from worker.ops.console.app import create_app
from worker.settings import load_settings

PASSWORD = "alice-password-0123"
TRUSTED, ELSEWHERE = "127.0.0.2", "127.0.0.1"  # the identity proxy's address, and anyone else's
EXTRA = {
    "console_actions": True,
    "console_user": "alice",
    "console_password": PASSWORD,
    "console_operators": "alice,carol",
    "console_operator_groups": "sre",
    "console_user_header": "X-Forwarded-User",
    "console_groups_header": "X-Forwarded-Groups",
    "console_trusted_proxies": TRUSTED,
}
WRONG = "wrong-secret-0123456789"
BEARER = "bearer-token"  # a request carrying the token itself: its holder's rights
# A DLQ entry's body, fixed: what its replay sends.
FIXED = '{"tenantId": "acme", "serviceCallId": "fixed", "dueAt": "2030-01-01T09:00:00Z"}'


@dataclass(frozen=True)
class Form:
    """A way of presenting credentials, and who it proves (None: no one)."""

    name: str
    identity: str | None
    login: dict[str, str] | None = None  # posted to /login first
    headers: dict[str, str] = field(default_factory=dict)  # sent with every request
    peer: str = ELSEWHERE
    groups: frozenset[str] = frozenset()


def forms(s: ConsoleSettings) -> list[Form]:
    """Every form the settings make possible: the token, the user and password, the identity
    proxy's header, alone, together, and each beside a wrong secret."""
    token, user, password = TOKEN, s.console_user or "", PASSWORD
    header, groups = s.console_user_header, s.console_groups_header
    bearer = {"Authorization": f"Bearer {token}"}
    found = [Form("nothing", None)]
    if s.console_token:
        found += [
            Form("token", "token", {"token": token}),
            Form("token with a user name", "token", {"token": token, "user": user}),
            Form("bearer", BEARER, headers=bearer),
            Form("wrong bearer", None, headers={"Authorization": f"Bearer {WRONG}"}),
            Form("wrong token", None, {"token": WRONG}),
            Form("token and a wrong bearer", "token", {"token": token}, {"Authorization": f"Bearer {WRONG}"}),
        ]
    if user:
        found += [
            Form("user and password", user, {"user": user, "password": password}),
            Form("wrong password", None, {"user": user, "password": WRONG}),
            Form("the token's name and the password", None, {"user": "token", "password": password}),
        ]
    if s.console_token and user:
        found += [
            Form("right token, wrong password", None, {"token": token, "user": user, "password": WRONG}),
            Form("wrong token, right password", None, {"token": WRONG, "user": user, "password": password}),
            Form("token and password", user, {"token": token, "user": user, "password": password}),
        ]
    if header:
        named = {header: "bob", groups: "sre"}
        found += [
            Form("proxy, operator by group", "bob", headers=named, peer=TRUSTED, groups=frozenset({"sre"})),
            Form("proxy, reader", "dave", headers={header: "dave", groups: "dev"}, peer=TRUSTED),
            Form("proxy header, untrusted", None, headers={header: user, groups: "sre"}),
            Form("token, proxy header untrusted", "token", {"token": token}, {header: user, groups: "sre"}),
            Form(
                "bearer, proxy header untrusted",
                BEARER,
                headers={"Authorization": f"Bearer {token}", header: user},
            ),
        ]
    return found


def operator(s: ConsoleSettings, form: Form) -> bool:
    """The rights the settings give who the form proves (the bearer is the token's holder)."""
    name = "token" if form.identity == BEARER else form.identity
    return s.console_actions and (name in s.operator_names or bool(form.groups & s.operator_groups))


@dataclass(frozen=True)
class Case:
    """A route's request: what it asks, and whether it acts (an operator's right)."""

    method: str
    url: str
    data: dict[str, str] = field(default_factory=dict)
    acts: str | None = None  # the audit line's `what`, for an action


# Every route of the app, by its path in the route table.
CASES = {
    "/login": Case("GET", "/login"),
    "/logout": Case("POST", "/logout"),
    "/": Case("GET", "/"),
    "/search": Case("POST", "/search", {"id": "sc-1"}),
    "/tenants": Case("GET", "/tenants"),
    "/tenants/{tenant:tenant}": Case("GET", "/tenants/acme"),
    "/timers/{tenant:tenant}/{sid:sid}": Case("GET", "/timers/acme/sc-1"),
    "/act/{what}/{tenant:tenant}/{sid:sid}": Case(
        "POST", "/act/pause/acme/sc-1", {"confirm": "yes"}, "pause"
    ),
    "/act-tenant/{what}/{tenant:tenant}": Case(
        "POST", "/act-tenant/pause/acme", {"confirm": "yes"}, "tenant_pause"
    ),
    "/act-labelled/{what}/{tenant:tenant}": Case(
        "POST", "/act-labelled/cancel/acme", {"label": "team=red"}, "labelled_cancel"
    ),
    "/dlq": Case("GET", "/dlq"),
    "/dlq/bulk": Case("POST", "/dlq/bulk", {"op": "purge", "confirm": "yes", "upto": "0"}, "dlq_purge"),
    "/dlq/{seq:int}": Case("GET", "/dlq/1"),
    "/dlq/{seq:int}/replay": Case("POST", "/dlq/{seq}/replay", {"body": FIXED}, "dlq_replay"),
    "/api/v1/overview": Case("GET", "/api/v1/overview"),
    "/api/v1/tenants": Case("GET", "/api/v1/tenants"),
    "/api/v1/tenants/{tenant}": Case("GET", "/api/v1/tenants/acme"),
    "/api/v1/timers": Case("GET", "/api/v1/timers?tenant=acme"),
    "/api/v1/timers/{tenant}/{sid:path}": Case("GET", "/api/v1/timers/acme/sc-1"),
    "/api/v1/dlq": Case("GET", "/api/v1/dlq"),
    "/api/v1/dlq/{seq:int}": Case("GET", "/api/v1/dlq/1"),
}
SETTINGS_SHAPE = ConsoleSettings.model_construct(  # the matrix's settings, before any server is
    console_token=TOKEN, **{k: v for k, v in EXTRA.items() if k != "console_password"}
)


class Audit(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[tuple[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) == "console_action":
            self.lines.append((record.user, record.what))  # type: ignore[attr-defined]


@dataclass
class Console:
    base: str
    settings: ConsoleSettings
    app: Any
    audit: Audit
    replayable: list[int]


@pytest.fixture(scope="module")
def module_db(servers: Servers, template_db: str) -> Iterator[str]:
    with fresh_database(servers.pg_url) as url:
        yield url


@pytest.fixture(scope="module")
async def console(servers: Servers, module_db: str) -> AsyncIterator[Console]:
    tag = f"t{uuid.uuid4().hex[:8]}"
    base_settings = load_settings(
        database_url=module_db, nats_url=servers.nats_url, log_format="text", **own_names(tag)
    )
    _seed(module_db, {"acme": 2})
    await asyncio.to_thread(_reject, base_settings, "acme", [f"broken-{i}" for i in range(8)])
    await _streams(base_settings)
    settings = console_settings(base_settings, **EXTRA)
    app = create_app(settings)
    # Wrong guesses are the matrix's cases, not an attack: none is held.
    app.state.console.throttle.FREE = 10**9
    audit, logger = Audit(), logging.getLogger("worker.ops.console")
    for name, known in logging.root.manager.loggerDict.items():  # a dictConfig elsewhere may disable them
        if name.startswith("worker.ops.console") and isinstance(known, logging.Logger):
            known.disabled = False
    logger.addHandler(audit)
    level, logger.level = logger.level, logging.INFO
    server = uvicorn.Server(uvicorn.Config(app, host="0.0.0.0", port=0, log_config=None))
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), what="console start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Console(f"http://127.0.0.1:{port}", settings, app, audit, list(range(1, 9)))
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)
        logger.removeHandler(audit)
        logger.level = level
        await delete_streams(servers.nats_url, tag)


def test_every_route_has_a_case() -> None:
    app = create_app(console_settings(load_settings(), **EXTRA))
    assert {route.path for route in app.routes} == set(CASES)


async def _client(console: Console, form: Form) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(local_address=form.peer)
    return httpx.AsyncClient(base_url=console.base, transport=transport, headers=form.headers)


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]*)"', page)
    return match.group(1) if match else ""


@pytest.mark.parametrize("form", forms(SETTINGS_SHAPE), ids=lambda f: f.name)
@pytest.mark.parametrize("path", list(CASES))
async def test_identity_and_rights_are_the_matching_secrets(console: Console, path: str, form: Form) -> None:
    case, s = CASES[path], console.settings
    async with await _client(console, form) as c:
        if form.login is not None:
            login = await c.post("/login", data=form.login)
            assert login.status_code == (401 if form.identity is None else 303), login.text[:200]
            assert ("timer_console" in login.cookies) == (form.identity is not None)
        if path == "/login":
            assert (await c.get("/login")).status_code == 200  # open to anyone: the door itself
            return
        if form.identity is None:
            refused = await c.request(case.method, case.url.format(seq=1), data=case.data)
            assert refused.status_code in (303, 401), refused.text[:200]
            assert refused.status_code == 401 or refused.headers["location"] == "/login"
            assert "acme" not in refused.text and "sc-1" not in refused.text
            return
        page = await c.get("/dlq")
        assert page.status_code == 200
        if form.identity != BEARER:  # a program's requests show no page of its own
            role = "operator" if operator(s, form) else "read-only"
            assert f"{form.identity} · {role}</span>" in page.text
        data = {**case.data, "csrf": _csrf(page.text)}
        if case.acts is None:
            answer = await c.request(case.method, case.url, data=data)
            assert answer.status_code in (200, 303), answer.text[:300]
            if path == "/logout" and form.login is not None:
                assert (await c.get("/")).status_code == 303, "the session ended"
            return
        await _act(console, c, form, case, data)


async def _act(console: Console, c: httpx.AsyncClient, form: Form, case: Case, data: dict[str, str]) -> None:
    console.audit.lines.clear()
    mine = "{seq}" in case.url and operator(console.settings, form)  # each replay an entry of its own
    url = case.url.format(seq=console.replayable.pop() if mine else 1)
    answer = await c.post(url, data=data)
    if not operator(console.settings, form):
        assert answer.status_code == 403, answer.text[:300]
        assert answer.text == f"{form.identity} may only read: not an operator (TIMER_CONSOLE_OPERATORS)"
        assert console.audit.lines == []
        return
    if case.acts == "labelled_cancel":  # offered first, then confirmed once
        once = re.search(r'name="once" value="([^"]+)"', answer.text)
        assert once, answer.text[:300]
        answer = await c.post(url, data={**data, "confirm": "yes", "once": once.group(1)})
    assert answer.status_code in (200, 303), answer.text[:300]
    assert console.audit.lines == [(form.identity, case.acts)]


BAD_PARTS = {"tenant": ["a%00", "a.b", "x" * 65], "sid": ["x%00", "x%01y", "x" * 201]}


@pytest.mark.parametrize("path", [p for p in CASES if "{tenant" in p or "{sid" in p])
async def test_a_path_part_that_can_name_nothing_is_refused_on_every_route(
    console: Console, path: str
) -> None:
    """A NUL or a control character reaches no database: a page's route does not match it (404),
    the API answers one line of JSON (400)."""
    case, status = CASES[path], 400 if path.startswith("/api/") else 404
    form = Form("token", "token", login={"token": TOKEN})
    async with await _client(console, form) as c:
        assert (await c.post("/login", data=form.login)).status_code == 303
        data = {**case.data, "csrf": _csrf((await c.get("/dlq")).text)}
        for part, bad in BAD_PARTS.items():
            if "{" + part not in path:
                continue
            good = "acme" if part == "tenant" else "sc-1"
            for value in bad:
                url = case.url.replace(f"/{good}", f"/{value}", 1)
                answer = await c.request(case.method, url, data=data)
                assert answer.status_code == status, (url, answer.status_code, answer.text[:200])
                assert status == 404 or "error" in answer.json()
