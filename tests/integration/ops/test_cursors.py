"""Paging cursors (worker/ops/cursors.py) as every reader of one gets them back: the console's
pages, its JSON API and `timer-service list --after`. A cursor is the sender's: one not of the
listing's key, whatever it decodes to, is one line saying so (400, or exit 2), never a traceback."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from tests.integration.ops.test_cli import run
from tests.integration.ops.test_console import TOKEN, console_settings
from tests.integration.ops.test_console_tenants import _seed
from worker.config import Settings
from worker.ops.console.app import create_app

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def crafted(key: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


# Keys no listing has: a part of the wrong kind, text Postgres cannot store, a time without its
# offset or none at all, a count out of a bigint's range, a part missing or one too many.
KEYS = [
    [{}],
    [1],
    ["a\u0000"],
    ["\ud800"],
    [None],
    [],
    ["a", "b", "c", "d"],
    [True, "acme"],
    [-1, "acme"],
    [2**64, "acme"],
    ["2030-01-01T00:00:00", "acme", "sc-1"],
    ["soon", "acme", "sc-1"],
    ["2030-01-01T00:00:00+00:00", "acme\u0000", "sc-1"],
    [["x"]],
]
# Every listing read with a cursor: its URL, the cursor appended.
LISTINGS = [
    "/api/v1/timers?tenant=acme&after=",
    "/api/v1/timers?tenant=acme&before=",
    "/api/v1/timers?tenant=acme&sort=due&after=",
    "/api/v1/timers?tenant=acme&sort=-due&before=",
    "/api/v1/tenants?after=",
    "/api/v1/tenants?sort=pending&after=",
    "/tenants/acme?after=",
    "/tenants/acme?sort=due&before=",
    "/tenants?after=",
    "/tenants?sort=pending&after=",
]


@pytest.fixture
def client(settings: Settings, db_url: str) -> Iterator[TestClient]:
    _seed(db_url, {"acme": 3})
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as c:
        yield c


@pytest.mark.parametrize("listing", LISTINGS)
def test_a_crafted_cursor_is_one_line_of_400_on_every_listing(client: TestClient, listing: str) -> None:
    for key in KEYS:
        answer = client.get(listing + crafted(key), headers=BEARER)
        assert answer.status_code == 400, (key, answer.text[:300])
        said = answer.json()["error"] if listing.startswith("/api/") else answer.text
        assert "not a cursor" in said or "bad cursor" in said, (key, said[:300])
        assert "Traceback" not in said


def test_a_cursor_of_the_listing_still_pages(client: TestClient) -> None:
    for listing in ("/api/v1/timers?tenant=acme&limit=1", "/api/v1/timers?tenant=acme&sort=due&limit=1"):
        first = client.get(listing, headers=BEARER).json()
        second = client.get(f"{listing}&after={first['next']}", headers=BEARER).json()
        assert [t["serviceCallId"] for t in first["timers"] + second["timers"]] == ["sc-1", "sc-2"]
    by_pending = client.get("/api/v1/tenants?sort=pending&limit=1", headers=BEARER).json()
    assert by_pending["tenants"] == [{"tenant": "acme", "pending": 3}]


@pytest.mark.parametrize(
    "listing",
    [["--tenant", "acme"], ["--state", "Scheduled"], ["--state", "Paused"]],
    ids=["a tenant's", "by due", "every paused"],
)
def test_list_refuses_a_crafted_cursor_in_one_line(db_url: str, listing: list[str]) -> None:
    for key in ([{}], [1], ["a\u0000"], ["soon", "acme", "x"]):
        result = run("list", *listing, "--after", crafted(key), TIMER_DATABASE_URL=db_url)
        assert result.returncode == 2, (key, result.stderr)
        assert result.stderr.strip().splitlines() == ["timer-service: not a cursor of this listing"], key
