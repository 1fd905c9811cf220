"""The console's door: nothing without credentials, constant-time checks, CSRF on every post."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.testclient import TestClient

from tests.helpers import jetstream, publish_raw, query, running_replica, until
from tests.integration.ops.test_cli import run
from worker import logs, metrics
from worker.adapters.jetstream.broker import Broker
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.stats import StatsRollup
from worker.config import ConsoleSettings, Settings
from worker.ops import dlq
from worker.ops.console.app import create_app
from worker.settings import load_console_settings

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
        "and TIMER_CONSOLE_PASSWORD, or TIMER_CONSOLE_USER_HEADER behind an identity proxy"
    ]
    short = run("console", TIMER_CONSOLE_TOKEN="short")
    assert short.returncode == 2 and "TIMER_CONSOLE_TOKEN" in short.stderr
    # A port of its own: 8081 may be another test's console (test files run side by side).
    unreachable = run(
        "console",
        TIMER_CONSOLE_TOKEN=TOKEN,
        TIMER_CONSOLE_PORT="0",
        TIMER_DATABASE_URL="postgresql://u@127.0.0.1:1/x",
    )
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


# --- issue 22's defects ---------------------------------------------------------------------


def _csrf(page: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match, page
    return match.group(1)


def _reject(settings: Settings, tenant: str, ids: list[str]) -> None:
    """ScheduleTimers with an unreadable dueAt, one per id, sent to a replica: DLQ entries, stored
    when this returns (beside any the tenant has already)."""

    async def send() -> None:
        async with running_replica(settings), jetstream(settings) as js, dlq.open_dlq(settings) as q:
            had = len((await q.page(dlq.DlqFilter(tenant=tenant), limit=dlq.MAX_SCAN)).entries)
            for sid in ids:
                body = {"tenantId": tenant, "serviceCallId": sid, "dueAt": "2030-01-01 09:00"}
                await publish_raw(js, settings, tenant, "schedule", body)

            async def stored() -> bool:
                page = await q.page(dlq.DlqFilter(tenant=tenant), limit=had + len(ids) + 1)
                return len(page.entries) == had + len(ids)

            await until(stored, what="DLQ copies")

    asyncio.run(send())


def test_rejected_commands_naming_a_timer_match_its_id_exactly_and_say_when_the_scan_stopped(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: the timer's page matched the id as a substring of the body (bulk-3 listed
    bulk-30 ... bulk-39), and read only a tenant's first 1,000 entries without saying so."""
    _reject(settings, "acme", ["bulk-3", *(f"bulk-3{i}" for i in range(10)), "other"])
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as client:
        _login(client)
        page = client.get("/timers/acme/bulk-3").text
        rejected = page.split("Rejected commands naming this timer")[1].split("</table>")[0]
        assert rejected.count("bad_due_at") == 1, rejected
        assert "stopped" not in page
        for module in ("worker.ops.console.views", "worker.ops.console.app"):
            monkeypatch.setattr(module + ".TIMER_DLQ_SCAN", 5, raising=False)
        cut = client.get("/timers/acme/other").text
        assert 'id="cut"' in cut and "stopped after 5 entries" in cut, cut


def test_pages_show_no_python_values_and_the_contracts_times(client: TestClient, db_url: str) -> None:
    """Issue 22: pages showed Python's None, True and False, and times with microseconds."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, repeat_every, lease_expires_at, "
        "attempts, last_error) VALUES ('acme', 'hourly', 'Scheduled', "
        "'2030-01-01 09:00:00.123456+00', 'PT1H', now() + interval '1 minute', 2, 'publish timed out')",
    )
    _login(client)
    for path in ("/", "/tenants/acme", "/timers/acme/hourly", "/timers/acme/secret-timer"):
        page = client.get(path)
        assert page.status_code == 200, path
        text = re.sub(r"<script.*?</script>", "", page.text, flags=re.S)
        assert not re.search(r"\b(None|True|False)\b", text), (
            path,
            re.findall(r".{60}\b(?:None|True|False)\b.{20}", text),
        )
        assert not re.search(r"\d\d:\d\d:\d\d\.\d{4,}", text), path
        assert not re.search(r"\d\d:\d\d:\d\d\+00:00", text), path
    timer = client.get("/timers/acme/hourly").text
    assert '<time datetime="2030-01-01T09:00:00.123Z">' in timer
    assert "every PT1H" in timer


def test_the_timer_page_shows_cron_until_and_data(client: TestClient, db_url: str) -> None:
    """The cron/data feature (repeat.cron, repeat.until, data): the page showed the data as a
    key-value line, not the JSON a DueTimeReached delivers, and until as bare text."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_cron, "
        "repeat_until, repeat_timezone, data) VALUES ('acme', 'weekdays', 'Scheduled', "
        "'2030-01-07 08:00:00+00', '2030-01-07 08:00:00+00', '0 9 * * MON-FRI', "
        '\'2030-06-30 00:00:00+00\', \'Europe/Paris\', \'{"invoice": 42, "tags": ["a", "b"]}\')',
    )
    _login(client)
    page = client.get("/timers/acme/weekdays").text
    repeat = page.split("<th>repeat</th><td>")[1].split("</td>")[0]
    assert repeat == (
        "cron 0 9 * * MON-FRI, "
        'until <time datetime="2030-06-30T00:00:00.000Z">2030-06-30T00:00:00.000Z</time>, '
        "timezone Europe/Paris"
    ), repeat
    data = page.split('<pre id="data">')[1].split("</pre>")[0]
    assert json.loads(data) == {"invoice": 42, "tags": ["a", "b"]}, data


def test_a_port_in_use_is_one_line(settings: Settings, db_url: str) -> None:
    """Issue 22: a taken port ended the console with uvicorn's JSON log lines, each carrying an
    ANSI-coloured `color_message` twin."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run(
            "console",
            TIMER_CONSOLE_TOKEN=TOKEN,
            TIMER_DATABASE_URL=db_url,
            TIMER_NATS_URL=settings.nats_url,
            TIMER_CONSOLE_PORT=str(port),
        )
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1, result.stderr
    assert "\x1b" not in result.stderr and "color_message" not in result.stderr
    assert f"127.0.0.1:{port}" in lines[0] and "TIMER_CONSOLE_PORT" in lines[0], lines[0]


def test_the_session_cookie_is_secure_when_served_over_tls(client: TestClient) -> None:
    """Issue 22: behind the TLS proxy it is meant to sit behind (the chart's Ingress), the console
    saw plain HTTP and set the session cookie without Secure."""
    plain = client.post("/login", data={"token": TOKEN})
    assert "secure" not in plain.headers["set-cookie"].lower()  # http://localhost still works
    proxied = client.post("/login", data={"token": TOKEN}, headers={"X-Forwarded-Proto": "https"})
    assert "; secure" in proxied.headers["set-cookie"].lower(), proxied.headers["set-cookie"]
    forwarded = client.post("/login", data={"token": TOKEN}, headers={"Forwarded": "for=1.2.3.4;proto=https"})
    assert "; secure" in forwarded.headers["set-cookie"].lower()


STRANGER = ("203.0.113.7", 40000)
HOLDER = ("198.51.100.2", 40000)


@contextlib.contextmanager
def held_waits(app: Any, gate: threading.Event | None = None) -> Iterator[list[float]]:
    """The waits the console's throttle holds wrong answers for, on a clock of this test's: each
    hold passes at once (or when `gate` is set), moving that clock on by the wait."""
    throttle, waits, clock = app.state.console.throttle, [], [time.monotonic()]

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        if gate is not None:
            await anyio.to_thread.run_sync(gate.wait)
        clock[0] += seconds

    throttle.clock, throttle.sleep = (lambda: clock[0]), sleep
    yield waits


def test_wrong_guesses_wait_per_source_and_a_right_secret_always_gets_in(settings: Settings) -> None:
    """A stranger's wrong guesses, logins or bearer tokens, hold the stranger's answers, 1 s
    doubling after the first ten; the token's holders get in from anywhere, the stranger's
    address included, at once."""
    app = create_app(console_settings(settings))
    with TestClient(app, client=STRANGER, follow_redirects=False) as stranger, held_waits(app) as waits:
        holder = TestClient(app, client=HOLDER, follow_redirects=False)
        for _ in range(12):
            assert stranger.post("/login", data={"token": "wrong-token-0000000"}).status_code == 401
        assert waits == [1.0, 2.0]
        assert holder.post("/login", data={"token": TOKEN}).status_code == 303
        assert stranger.post("/login", data={"token": TOKEN}).status_code == 303
        stranger.cookies.clear()  # a program's requests: the bearer token alone
        holder.cookies.clear()
        wrong = {"Authorization": "Bearer wrong-token-0000000"}
        assert stranger.get("/api/v1/tenants", headers=wrong).status_code == 401
        right = {"Authorization": f"Bearer {TOKEN}"}
        assert stranger.get("/api/v1/tenants", headers=right).status_code == 200
        assert holder.get("/api/v1/tenants", headers=wrong).status_code == 401
        assert waits == [1.0, 2.0, 4.0], "the bearer's guess held as a login's; the holder's not at all"


def test_a_sources_guesses_are_checked_one_at_a_time(settings: Settings) -> None:
    """While a wrong guess's answer is held, the next guess from its source waits its turn (else a
    right one answered at once would tell, at any rate, which ones were wrong); another source's
    does not."""
    app = create_app(console_settings(settings))
    gate, throttle = threading.Event(), app.state.console.throttle
    with TestClient(app, client=STRANGER, follow_redirects=False) as stranger:
        for _ in range(10):
            assert stranger.post("/login", data={"token": "wrong-token-0000000"}).status_code == 401
        with held_waits(app, gate) as waits, ThreadPoolExecutor(2) as pool:
            wrong = pool.submit(stranger.post, "/login", data={"token": "wrong-token-0000000"})
            until_sync(lambda: waits == [1.0], "the wrong guess held")
            right = pool.submit(stranger.post, "/login", data={"token": TOKEN})
            until_sync(lambda: throttle.waiting(STRANGER[0]) == 2, "the right guess waiting its turn")
            holder = TestClient(app, client=HOLDER, follow_redirects=False)
            assert holder.post("/login", data={"token": TOKEN}).status_code == 303
            assert not right.done()
            gate.set()
            assert wrong.result(timeout=30).status_code == 401
            assert right.result(timeout=30).status_code == 303
        assert waits == [1.0]


def test_behind_a_trusted_proxy_the_source_is_the_address_it_forwards(settings: Settings) -> None:
    app = create_app(console_settings(settings, console_trusted_proxies="10.1.0.0/16"))
    with (
        TestClient(app, client=("10.1.2.3", 40000), follow_redirects=False) as proxy,
        held_waits(app) as waits,
    ):
        wrong = {"token": "wrong-token-0000000"}
        for _ in range(11):
            proxy.post("/login", data=wrong, headers={"X-Forwarded-For": f"10.1.9.9, {STRANGER[0]}"})
        assert waits == [1.0]
        proxy.post("/login", data=wrong, headers={"X-Forwarded-For": f"{STRANGER[0]}, {HOLDER[0]}"})
        assert waits == [1.0], "another client behind the proxy: a source of its own"
        # From anyone else the header is the client's own word: its address is the source (the
        # one already counted through the proxy, and ten more).
        elsewhere = TestClient(app, client=HOLDER, follow_redirects=False)
        for _ in range(10):
            elsewhere.post("/login", data=wrong, headers={"X-Forwarded-For": STRANGER[0]})
        assert waits == [1.0, 1.0]


def until_sync(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_the_overview_does_not_count_the_whole_table_on_every_look(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 22: every overview ran `SELECT state, count(*) FROM timers GROUP BY state`, a scan of
    the whole table; now it is read at most every 30 s and shown with its age."""
    counted = []
    execute = psycopg.Connection.execute

    def spy(self: psycopg.Connection[Any], statement: Any, *args: Any, **kwargs: Any) -> Any:
        if statement == QUERIES["status_counts"]:
            counted.append(1)
        return execute(self, statement, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", spy)
    _login(client)
    for _ in range(3):
        assert client.get("/").status_code == 200
        assert client.get("/?live=1").status_code == 200
    assert len(counted) == 1


def test_uvicorn_lines_carry_no_ansi_twin(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 22: every uvicorn line of the console's log carried `color_message`, the message
    again with ANSI colour codes, into the JSON."""
    logs.setup("INFO", "json")
    logging.getLogger("uvicorn.error").info(
        "Started server process [%d]",
        7,
        extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"},
    )
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert json.loads(line)["msg"] == "Started server process [7]" and "color_message" not in line


# --- what issue 22 asked the console to become ------------------------------------------------


def test_replicas_write_minute_stats_that_the_overview_charts(settings: Settings, db_url: str) -> None:
    """A replica's rollup adds its counters to its minute's row; the overview draws them and
    lists the replica as alive, holding a lease or not."""

    async def two_writes() -> None:
        async with AsyncConnectionPool(db_url, min_size=1, max_size=1, kwargs={"autocommit": True}) as pool:
            rollup = StatsRollup(pool, "replica-a")
            metrics.FIRED.inc(120)
            metrics.LATENESS_SECONDS.observe(0.004)
            await rollup.write()
            metrics.FIRED.inc(30)
            await rollup.write()

    asyncio.run(two_writes())
    ((fired, buckets),) = query(
        db_url, "SELECT fired, lateness FROM timer_stats WHERE worker_id = 'replica-a'"
    )
    assert fired == 150 and sum(buckets) == 1
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as client:
        _login(client)
        page = client.get("/").text
    replicas = page.split('id="replicas"')[1].split("</table>")[0]
    assert "replica-a" in replicas and "alive" in replicas
    assert ('id="chart-fires"' in page and "<polyline" in page) or "<circle" in page
    assert re.search(r"fires/s \d", page), page
    assert "p50 4 ms" in page or "p50 3 ms" in page, re.findall(r"p50 [^<]*", page)


def test_search_finds_timers_of_any_tenant_by_service_call_or_correlation_id(
    client: TestClient, db_url: str
) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, correlation_id) VALUES "
        "('globex', 'secret-timer', 'Scheduled', now() + interval '1 hour', NULL), "
        "('initech', 'order-7-reminder', 'Scheduled', now() + interval '1 hour', 'order-7')",
    )
    csrf = _login(client)
    both = client.post("/search", data={"id": "secret-timer", "csrf": csrf})
    assert both.status_code == 200
    found = both.text.split('id="found"')[1]
    assert "/timers/acme/secret-timer" in found and "/timers/globex/secret-timer" in found
    one = client.post("/search", data={"id": "order-7", "csrf": csrf})
    assert one.status_code == 303 and one.headers["location"] == "/timers/initech/order-7-reminder"
    none = client.post("/search", data={"id": "nothing-like-it", "csrf": csrf})
    assert "no timer has this serviceCallId or correlationId" in none.text


def test_a_tenants_timers_sort_either_way_and_page_back_and_forth_with_a_total(
    client: TestClient, db_url: str
) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "SELECT 'acme', 't-' || lpad(i::text, 3, '0'), 'Scheduled', now() + i * interval '1 minute' "
        "FROM generate_series(1, 120) AS i",
    )
    _login(client)

    def ids(page: str) -> list[str]:
        return re.findall(r'href="/timers/acme/([^"]+)"', page.split('id="timers"')[1])

    first = client.get("/tenants/acme").text
    assert "50 shown of 121 timers" in first and ids(first)[0] == "secret-timer"
    assert 'rel="prev"' not in first
    nxt = re.search(r'href="([^"]+)" rel="next"', first)
    assert nxt
    second = client.get("/tenants/acme" + nxt.group(1).replace("&amp;", "&")).text
    assert ids(second)[0] == "t-050" and 'rel="prev"' in second
    prev = re.search(r'href="([^"]+)" rel="prev"', second)
    assert prev
    back = client.get("/tenants/acme" + prev.group(1).replace("&amp;", "&")).text
    assert ids(back) == ids(first)
    assert ids(client.get("/tenants/acme?sort=-id").text)[0] == "t-120"
    by_due = client.get("/tenants/acme?sort=due").text
    assert ids(by_due)[:2] == ["secret-timer", "t-001"] and "121 Scheduled timers" in by_due
    assert ids(client.get("/tenants/acme?sort=-due").text)[0] == "t-120"


async def _streams(settings: Settings) -> None:
    """The streams, as a replica creates them, with no replica to apply what is sent."""
    broker = Broker(settings)
    await broker.connect()
    try:
        await broker.ensure_streams()
    finally:
        await broker.close()


def test_actions_are_refused_when_off_confirmed_first_and_audited(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "VALUES ('acme', 'secret-timer', 'Scheduled', now() + interval '1 hour')",
    )
    asyncio.run(_streams(settings))
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as off:
        csrf = _login(off)
        assert (
            off.post("/act/cancel/acme/secret-timer", data={"csrf": csrf, "confirm": "yes"}).status_code
            == 403
        )
        assert (
            off.post(
                "/dlq/bulk", data={"csrf": csrf, "op": "purge", "confirm": "yes", "upto": "9"}
            ).status_code
            == 403
        )
    with (
        TestClient(
            create_app(console_settings(settings, console_actions=True)), follow_redirects=False
        ) as on,
        caplog.at_level(logging.INFO, logger="worker.ops.console"),
    ):
        csrf = _login(on)
        assert on.post("/act/cancel/acme/secret-timer", data={"confirm": "yes"}).status_code == 403  # no CSRF
        asked = on.post("/act/cancel/acme/secret-timer", data={"csrf": csrf})
        assert asked.status_code == 200 and "Yes, cancel" in asked.text
        assert not [r for r in caplog.records if getattr(r, "action", None) == "console_action"]
        bad = on.post("/act/reschedule/acme/secret-timer", data={"csrf": csrf, "dueAt": "tomorrow"})
        assert bad.status_code == 422
        done = on.post("/act/cancel/acme/secret-timer", data={"csrf": csrf, "confirm": "yes"})
        assert done.status_code == 303 and done.headers["location"] == "/timers/acme/secret-timer?done=cancel"
    (line,) = [r for r in caplog.records if getattr(r, "action", None) == "console_action"]
    assert (line.user, line.what, line.tenant, line.id) == ("token", "cancel", "acme", "secret-timer")  # type: ignore[attr-defined]


def test_a_windowed_timer_shows_its_due_at_and_beside_it_when_it_is_planned(
    client: TestClient, db_url: str
) -> None:
    """As `get` and `timer-service list` show it: dueAt the nominal instant, the planned one beside."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, nominal_due_at, fire_window) "
        "VALUES ('acme', 'spread', 'Scheduled', '2030-01-01T00:07:00Z', '2030-01-01T00:00:00Z', 'PT10M')",
    )
    _login(client)
    row = client.get("/tenants/acme").text.split('href="/timers/acme/spread"')[1].split("</tr>")[0]
    assert re.findall(r"<time[^>]*>([^<]+)</time>", row) == [
        "2030-01-01T00:00:00.000Z",
        "2030-01-01T00:07:00.000Z",
    ]
    assert "planned" in row
