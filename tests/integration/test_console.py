"""The console's door: nothing without credentials, constant-time checks, CSRF on every post."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from tests.helpers import query
from tests.integration.test_cli import run
from worker.config import ConsoleSettings, Settings, load_console_settings
from worker.ops.console.app import create_app

TOKEN = "console-token-0123456789"
ROUTES = [
    ("GET", "/"),
    ("GET", "/tenants/acme"),
    ("GET", "/timers/acme/secret-timer"),
    ("GET", "/dlq"),
    ("GET", "/dlq/1"),
    ("POST", "/dlq/1/replay"),
    ("POST", "/search"),
    ("POST", "/logout"),
]


def console_settings(settings: Settings, **extra: object) -> ConsoleSettings:
    return load_console_settings(
        **settings.model_dump(exclude={"database_url"}),
        database_url=settings.database_url,
        console_token=TOKEN,
        **extra,
    )


@pytest.fixture
def client(settings: Settings, db_url: str) -> Iterator[TestClient]:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "VALUES ('acme', 'secret-timer', 'Scheduled', now() - interval '1 minute')",
    )
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as c:
        yield c


def _login(client: TestClient) -> str:
    response = client.post("/login", data={"token": TOKEN})
    assert response.status_code == 303 and response.headers["location"] == "/"
    page = client.get("/").text
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page
    return match.group(1)


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_needs_credentials(client: TestClient, method: str, path: str) -> None:
    response = client.request(method, path, data={"tenant": "acme", "id": "secret-timer"})
    assert response.status_code in (303, 401)
    assert response.status_code == 401 or response.headers["location"] == "/login"
    assert (
        "acme" not in response.text
        and "secret-timer" not in response.text
        and "Scheduled" not in response.text
    )
    bad = client.request(method, path, headers={"Authorization": "Bearer wrong-token-123456"})
    assert bad.status_code in (303, 401) and "secret-timer" not in bad.text


def test_wrong_credentials_are_refused_and_right_ones_open_a_session(client: TestClient) -> None:
    refused = client.post("/login", data={"token": TOKEN[:-1]})
    assert refused.status_code == 401 and "timer_console" not in refused.cookies
    _login(client)
    page = client.get("/timers/acme/secret-timer")
    assert page.status_code == 200 and "overdue" in page.text and "unclaimed" in page.text
    assert (
        page.headers["cache-control"] == "no-store"
        and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    )
    assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_posts_need_the_session_csrf_token(client: TestClient) -> None:
    csrf = _login(client)
    assert client.post("/search", data={"tenant": "acme", "id": "secret-timer"}).status_code == 403
    assert client.post("/search", data={"tenant": "acme", "csrf": "forged"}).status_code == 403
    found = client.post("/search", data={"tenant": "acme", "id": "secret-timer", "csrf": csrf})
    assert found.status_code == 303 and found.headers["location"] == "/timers/acme/secret-timer"
    # Read-only unless an operator enables actions, whatever the form says.
    assert client.post("/dlq/1/replay", data={"csrf": csrf, "body": "{}"}).status_code == 403
    assert client.post("/logout", data={"csrf": csrf}).status_code == 303
    assert client.get("/").status_code == 303, "logged out"


def test_the_console_refuses_to_start_without_credentials(db_url: str) -> None:
    result = run("console", TIMER_DATABASE_URL=db_url)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "timer-service: TIMER_CONSOLE_TOKEN: the console needs TIMER_CONSOLE_TOKEN, or TIMER_CONSOLE_USER "
        "and TIMER_CONSOLE_PASSWORD"
    ]
    short = run("console", TIMER_CONSOLE_TOKEN="short")
    assert short.returncode == 2 and "TIMER_CONSOLE_TOKEN" in short.stderr
    unreachable = run("console", TIMER_CONSOLE_TOKEN=TOKEN, TIMER_DATABASE_URL="postgresql://u@127.0.0.1:1/x")
    assert unreachable.returncode == 1 and len(unreachable.stderr.splitlines()) == 1, unreachable.stderr


def test_a_login_body_larger_than_a_form_of_credentials_is_refused_unread(client: TestClient) -> None:
    """/login is open to anyone: without a limit, one request could make the console hold any
    amount of memory (a form) or disk (a multipart upload). Declared or streamed, past 8 KiB: 413."""
    upload = {"token": ("t.txt", b"x" * (4 << 20))}  # a 4 MiB multipart file: spooled to disk
    assert client.post("/login", files=upload).status_code == 413
    fields = {f"f{i}": "x" * 900_000 for i in range(4)}  # each field under Starlette's 1 MiB
    assert client.post("/login", data=fields).status_code == 413
    streamed = (b"&f=" + b"x" * 65_536 for _ in range(64))  # chunked: no Content-Length to trust
    assert client.post("/login", content=streamed).status_code == 413
    refused = client.post("/login", data={"token": TOKEN[:-1]})  # a normal form is still read
    assert refused.status_code == 401
