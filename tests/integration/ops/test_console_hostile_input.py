"""A reader with the token, and a stranger, against the console over HTTP with hostile values (DLQ
sequences out of range, NUL and control characters, huge numbers and bodies, broken headers and
cookies): no route, query parameter, form field, header or cookie answers 500."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.ops.test_console import TOKEN
from tests.integration.ops.test_console_identity import Console, console, module_db  # noqa: F401

BEARER = {"Authorization": f"Bearer {TOKEN}"}
HUGE = "9" * 40
NUL = "%00"

GETS = [
    f"/dlq/{HUGE}",
    f"/api/v1/dlq/{HUGE}",
    "/dlq/18446744073709551616",
    "/api/v1/dlq/18446744073709551616",
    "/dlq/0",
    "/api/v1/dlq/0",
    f"/dlq?after={HUGE}",
    "/dlq?after=18446744073709551615",
    "/api/v1/dlq?after=18446744073709551615",
    "/dlq?from=99999-01-01",
    "/dlq?from=0001-01-01T00:00:00Z",
    "/dlq?to=0001-01-01T00:00:00%2B23:59",
    "/dlq?from=9999-12-31T23:59:59-23:59",
    "/api/v1/dlq?from=9999-12-31T23:59:59-23:59",
    "/api/v1/dlq?to=0001-01-01T00:00:00%2B14:00",
    f"/dlq?id=a{NUL}b",
    f"/dlq?tenant=acme&id={NUL}",
    "/dlq?from=1e400",
    f"/tenants?prefix={NUL}",
    f"/tenants?after={NUL}",
    f"/api/v1/tenants?prefix={NUL}",
    f"/api/v1/tenants?after={NUL}",
    "/api/v1/tenants?after=" + "x" * 5000,
    "/api/v1/tenants?sort=zzz",
    f"/api/v1/tenants?sort={NUL}",
    "/tenants?sort=pending&after=" + "%ff" * 10,
    "/tenants?sort=pending&after=abc",
    "/api/v1/tenants?sort=pending&after=abc",
    "/api/v1/tenants?sort=pending&after=-1:acme",
    "/api/v1/tenants?sort=pending&after=99999999999999999999999:acme",
    f"/api/v1/timers?tenant=acme&label=a{NUL}=b",
    f"/api/v1/timers?tenant=acme&label=a=b{NUL}",
    f"/tenants/acme?label=a=b{NUL}",
    f"/api/v1/timers?tenant=acme&after={NUL}",
    f"/api/v1/timers?tenant=acme&before={NUL}",
    "/api/v1/timers?tenant=acme&after=" + "%ff" * 20,
    "/api/v1/timers?tenant=acme&sort=due&after=2024-01-01T00:00:00Z|x",
    "/api/v1/timers?tenant=acme&sort=due&after=x|y",
    "/api/v1/timers?tenant=acme&sort=due&after=99999-01-01T00:00:00Z%09x",
    "/api/v1/timers?tenant=acme&sort=due&before=-1",
    f"/tenants/acme?after={NUL}",
    f"/tenants/acme?sort=due&after={NUL}",
    "/tenants/acme?sort=due&after=" + "A" * 3000,
    f"/tenants/acme?state={NUL}",
    "/tenants/acme?state=Paused",
    "/api/v1/timers?tenant=acme&state=Paused",
    "/api/v1/timers?tenant=acme&limit=%EF%BC%91",  # fullwidth 1
    "/api/v1/timers?tenant=acme&limit=0",
    "/api/v1/timers?tenant=acme&limit=٣",  # arabic-indic 3
    f"/api/v1/timers/acme/{NUL}",
    "/api/v1/timers/acme/" + "x" * 5000,
    "/api/v1/timers/acme/a/b/c",
    f"/api/v1/tenants/{NUL}",
    "/api/v1/tenants/" + "a" * 5000,
    f"/timers/acme/a{NUL}",
    "/timers/acme/%C2%85",
    "/tenants/%ED%A0%80",  # a lone surrogate, utf-8 encoded
    "/timers/acme/%ED%A0%80",
    "/api/v1/timers/acme/%ED%A0%80",
    "/api/v1/tenants/%ED%A0%80",
    "/api/v1/timers?tenant=acme&after=%ED%A0%80",
    "/tenants?prefix=%ED%A0%80",
    "/dlq?id=%ED%A0%80",
    "/?live=1",
    "/tenants/acme?live=1&label=",
    "/tenants/acme?label==",
    "/tenants/acme?label=%3D%3D%3D",
]

POSTS = [
    ("/search", {"id": "a\x00b"}),
    ("/search", {"id": "\udcff"}),
    ("/search", {"tenant": "\x00"}),
    ("/search", {}),
    ("/act-labelled/cancel/acme", {"label": "a=b\x00"}),
    ("/act-labelled/zzz/acme", {"label": "a=b"}),
    ("/act/zzz/acme/sc-1", {"confirm": "yes"}),
    ("/dlq/bulk", {"op": "zzz"}),
    ("/dlq/bulk", {"op": "purge", "upto": HUGE, "confirm": "yes"}),
    ("/dlq/bulk", {"op": "replay", "upto": HUGE}),
    ("/dlq/bulk", {"op": "replay", "from": "99999-01-01"}),
    (f"/dlq/{HUGE}/replay", {"body": "{}"}),
    ("/dlq/1/replay", {"body": "\x00"}),
    ("/dlq/1/replay", {"body": "x" * 2_000_000}),
]


@pytest.mark.parametrize("url", GETS)
async def test_no_get_is_a_500(console: Console, url: str) -> None:  # noqa: F811
    async with httpx.AsyncClient(base_url=console.base, headers=BEARER) as c:
        answer = await c.get(url)
    assert answer.status_code < 500, f"{url}: {answer.status_code} {answer.text[:300]}"


def _sendable(data: dict[str, str]) -> bool:
    try:
        "".join(data.values()).encode()
    except UnicodeEncodeError:
        return False
    return True


POSTS = [p for p in POSTS if _sendable(p[1])]  # a lone surrogate no client can put in a form


@pytest.mark.parametrize("url,data", POSTS, ids=[p[0] + str(i) for i, p in enumerate(POSTS)])
async def test_no_post_is_a_500(console: Console, url: str, data: dict[str, str]) -> None:  # noqa: F811
    async with httpx.AsyncClient(base_url=console.base, headers=BEARER) as c:
        answer = await c.post(url, data=data)
    assert answer.status_code < 500, f"{url} {data!r:.80}: {answer.status_code} {answer.text[:300]}"


HEADERS = [
    {"Authorization": "Bearer " + "x" * 100000},
    {"Cookie": "timer_console=\x7f"},
    {"Cookie": "timer_console=" + "a" * 8000},
    {"Cookie": "=; ;;timer_console"},
    {"Content-Type": "multipart/form-data; boundary=x"},
]


@pytest.mark.parametrize("extra", HEADERS, ids=range(len(HEADERS)))
async def test_no_header_is_a_500(console: Console, extra: dict[str, str]) -> None:  # noqa: F811
    async with httpx.AsyncClient(base_url=console.base) as c:
        for method, url in (
            ("GET", "/"),
            ("GET", "/api/v1/tenants"),
            ("POST", "/login"),
            ("POST", "/search"),
        ):
            answer = await c.request(method, url, headers=extra, content=b"--x\r\n")
            assert answer.status_code < 500, f"{method} {url} {extra!r:.80}: {answer.status_code}"
