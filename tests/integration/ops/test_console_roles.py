"""The console's roles and identities (worker/ops/console/auth.py: Roles, ProxyIdentity): operators
act, everyone else only reads (no action shown, 403 on an action's post); behind an identity proxy
its header names the user, audited by name, and is believed only from the proxies configured."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.helpers import query
from tests.integration.ops.test_console import TOKEN, _login, _streams, console_settings
from worker.config import Settings
from worker.ops.console.app import create_app

PROXY = ("10.1.2.3", 40000)  # the identity proxy's address, as the console sees it
ELSEWHERE = ("203.0.113.9", 40000)  # a client reaching the console around the proxy
BEHIND_PROXY = {
    "console_user_header": "X-Forwarded-User",
    "console_groups_header": "X-Forwarded-Groups",
    "console_trusted_proxies": "10.1.0.0/16, 127.0.0.1",
}
# Every action's post: a timer's, a tenant's, a DLQ entry's, the DLQ's bulk.
ACTIONS = [
    ("/act/cancel/acme/t-1", {"confirm": "yes"}),
    ("/act/pause/acme/t-1", {"confirm": "yes"}),
    ("/act-tenant/pause/acme", {"confirm": "yes"}),
    ("/act-labelled/cancel/acme", {"confirm": "yes", "label": "campaign=bf", "once": "any"}),
    ("/dlq/1/replay", {"confirm": "yes", "body": "{}"}),
    ("/dlq/bulk", {"op": "purge", "confirm": "yes", "upto": "9"}),
]


@pytest.fixture(autouse=True)
def a_timer(settings: Settings, db_url: str) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "VALUES ('acme', 't-1', 'Scheduled', now() + interval '1 hour')",
    )
    asyncio.run(_streams(settings))


@contextlib.contextmanager
def console(settings: Settings, peer: tuple[str, int] = PROXY, **extra: Any) -> Iterator[TestClient]:
    app = create_app(console_settings(settings, console_actions=True, **extra))
    with TestClient(app, follow_redirects=False, client=peer) as c:
        yield c


def csrf_of(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page
    return match.group(1)


def audited(caplog: pytest.LogCaptureFixture) -> list[tuple[Any, ...]]:
    return [
        (r.user, r.what, r.tenant)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "action", None) == "console_action"
    ]


def test_a_user_header_is_ignored_unless_configured(settings: Settings) -> None:
    # Without TIMER_CONSOLE_USER_HEADER any client could name itself: nothing gets in by it.
    with console(settings) as c:
        forged = {"X-Forwarded-User": "alice"}
        page = c.get("/timers/acme/t-1", headers=forged)
        assert page.status_code == 303 and page.headers["location"] == "/login"
        for path, form in ACTIONS:
            assert c.post(path, data=form, headers=forged).status_code == 401, path


def test_a_user_header_is_ignored_from_anyone_but_the_proxies(settings: Settings) -> None:
    with console(settings, peer=ELSEWHERE, **BEHIND_PROXY) as c:
        forged = {"X-Forwarded-User": "bob", "X-Forwarded-Groups": "sre"}
        page = c.get("/", headers=forged)
        assert page.status_code == 303 and page.headers["location"] == "/login"
        for path, form in ACTIONS:
            assert c.post(path, data=form, headers=forged).status_code == 401, path
        _login(c)  # the token still logs in, around the proxy
        assert "token · operator" in c.get("/").text


def test_a_reader_sees_no_action_and_is_refused_one(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.ops.console")
    with console(settings, console_operators="bob", **BEHIND_PROXY) as c:
        alice = {"X-Forwarded-User": "alice", "X-Forwarded-Groups": "dev, support"}
        timer = c.get("/timers/acme/t-1", headers=alice)
        assert timer.status_code == 200 and "alice · read-only" in timer.text
        assert "Cancel…" not in timer.text and "Pause…" not in timer.text
        assert "You may only read (not an operator" in timer.text
        assert "Pause tenant" not in c.get("/tenants/acme", headers=alice).text
        assert "matching…" not in c.get("/tenants/acme?label=campaign%3Dbf", headers=alice).text
        assert "Log out" not in timer.text, "the proxy names her on each request: nothing to log out of"
        csrf = csrf_of(timer.text)
        for path, form in ACTIONS:  # her own valid CSRF token: refused for her role alone
            refused = c.post(path, data={**form, "csrf": csrf}, headers=alice)
            assert refused.status_code == 403, path
            assert refused.text == "alice may only read: not an operator (TIMER_CONSOLE_OPERATORS)"
        assert audited(caplog) == []


def test_an_operator_named_by_the_proxy_acts_and_is_audited_by_name(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.ops.console")
    with console(settings, console_operators="bob", console_operator_groups="sre", **BEHIND_PROXY) as c:
        for user, groups in (("bob", ""), ("carol", "dev,sre")):  # by name, by group
            who = {"X-Forwarded-User": user, "X-Forwarded-Groups": groups}
            tenant = c.get("/tenants/acme", headers=who)
            assert f"{user} · operator" in tenant.text and "Pause tenant…" in tenant.text
            done = c.post(
                "/act-tenant/pause/acme", data={"csrf": csrf_of(tenant.text), "confirm": "yes"}, headers=who
            )
            assert done.status_code == 303, done.text
            # Another user's CSRF token is not hers: it is the HMAC of the name.
            other = {"X-Forwarded-User": "mallory", "X-Forwarded-Groups": "sre"}
            forged = c.post(
                "/act-tenant/pause/acme", data={"csrf": csrf_of(tenant.text), "confirm": "yes"}, headers=other
            )
            assert forged.status_code == 403
    assert audited(caplog) == [("bob", "tenant_pause", "acme"), ("carol", "tenant_pause", "acme")]


def test_the_token_is_an_operator_only_when_named_once_roles_are_set(settings: Settings) -> None:
    with console(settings, console_operators="bob") as c:
        csrf = _login(c)
        page = c.get("/timers/acme/t-1").text
        assert "token · read-only" in page and "Cancel…" not in page
        assert c.post("/act/cancel/acme/t-1", data={"csrf": csrf, "confirm": "yes"}).status_code == 403
        c.cookies.clear()  # a program: the bearer token alone, no session
        bearer = {"Authorization": f"Bearer {TOKEN}"}
        assert c.post("/act/cancel/acme/t-1", data={"confirm": "yes"}, headers=bearer).status_code == 403
    with console(settings, console_operators="bob,token") as c:
        _login(c)
        assert "token · operator" in c.get("/timers/acme/t-1").text


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        ({"X-Forwarded-User": " "}, "the identity proxy's user header holds no user name"),
        ({"X-Forwarded-User": "a" * 257}, "the identity proxy's user header holds no user name"),
        (
            {"X-Forwarded-User": "alice", "X-Forwarded-Groups": ",".join(f"g{i}" for i in range(101))},
            "the identity proxy's groups header holds more than 100 groups",
        ),
    ],
    ids=["blank", "too long", "too many groups"],
)
def test_a_malformed_identity_is_refused_in_one_line(
    settings: Settings, headers: dict[str, str], said: str
) -> None:
    with console(settings, **BEHIND_PROXY) as c:
        refused = c.get("/", headers=headers)
        assert refused.status_code == 400 and refused.text.startswith(said)
        assert len(refused.text.splitlines()) == 1
