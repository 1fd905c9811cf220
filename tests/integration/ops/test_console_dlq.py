"""The console's DLQ filter (worker/ops/console/dlq_views.py): by serviceCallId and by the time an
entry was stored, with tenant and reason, page after page; the bulk actions act on what the filter
showed and nothing else; a filter that is not one is a line on the page, never a 500."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from starlette.testclient import TestClient

from tests.integration.ops.test_console import TOKEN, _csrf, _reject, console_settings
from worker.config import Settings
from worker.ops import dlq
from worker.ops.console.app import create_app

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def _last_stored(settings: Settings) -> datetime:
    async def read() -> datetime:
        async with dlq.open_dlq(settings) as q:
            page = await q.page(dlq.DlqFilter(), limit=1000)
            stored = page.entries[-1].time
            assert stored is not None
            return stored

    return asyncio.run(read())


@pytest.fixture
def two_batches(settings: Settings) -> Iterator[tuple[TestClient, datetime]]:
    """Rejected commands in two batches, stored before and after a boundary time; a console with
    actions on, logged in."""
    _reject(settings, "acme", ["a-1", "a-2", "twice"])
    boundary = _last_stored(settings) + timedelta(microseconds=1)
    _reject(settings, "acme", ["b-1", "twice"])
    _reject(settings, "globex", ["twice"])
    with TestClient(
        create_app(console_settings(settings, console_actions=True)), follow_redirects=False
    ) as c:
        assert c.post("/login", data={"token": TOKEN}).status_code == 303
        yield c, boundary


def _listed(client: TestClient, **params: str) -> list[tuple[str, str]]:
    """(tenant, serviceCallId) of every entry the DLQ page lists for this filter, following its pages."""
    page = client.get("/dlq?" + urllib.parse.urlencode(params))
    assert page.status_code == 200, page.text
    table = page.text.split('id="entries"')[1].split("</table>")[0]
    return re.findall(r"<td>(acme|globex)</td><td>([^<]+)</td>", table)


def test_the_dlq_filters_by_id_and_stored_time_in_any_combination(
    two_batches: tuple[TestClient, datetime],
) -> None:
    client, boundary = two_batches
    at = boundary.isoformat()
    assert sorted(_listed(client, id="twice")) == [("acme", "twice"), ("acme", "twice"), ("globex", "twice")]
    assert _listed(client, id="twice", tenant="acme", **{"from": at}) == [("acme", "twice")]
    assert _listed(client, tenant="acme", to=at) == [("acme", "a-1"), ("acme", "a-2"), ("acme", "twice")]
    assert _listed(client, tenant="acme", **{"from": at}) == [("acme", "b-1"), ("acme", "twice")]
    naive = boundary.replace(tzinfo=None).isoformat()  # no offset: UTC, as the field says
    assert _listed(client, tenant="acme", to=naive) == _listed(client, tenant="acme", to=at)
    assert _listed(client, id="twi") == [], "an id is matched exactly"
    assert _listed(client, reason="bad_due_at", id="b-1") == [("acme", "b-1")]


def test_the_dlq_pages_keep_the_filter(two_batches: tuple[TestClient, datetime]) -> None:
    """One entry a page (the JSON API's limit): following `next` lists the filter's entries, each once."""
    client, boundary = two_batches
    seen, after = [], "0"
    while after is not None:
        answer = client.get(
            "/api/v1/dlq", params={"id": "twice", "limit": "1", "after": after}, headers=BEARER
        )
        assert answer.status_code == 200, answer.text
        seen += [(e["tenant"], e["seq"]) for e in answer.json()["entries"]]
        after = None if answer.json()["next"] is None else str(answer.json()["next"])
    assert [t for t, _ in seen] == ["acme", "acme", "globex"] and len({s for _, s in seen}) == 3
    kept = urllib.parse.urlencode({"tenant": "acme", "from": boundary.isoformat()})
    page = client.get(f"/dlq?{kept}&after=1").text
    escaped = kept.replace("&", "&amp;")
    assert f'<a href="/dlq?after=0&amp;{escaped}">First page</a>' in page
    assert f'name="from" value="{boundary.isoformat()}"' in page


def test_a_bulk_purge_takes_the_id_and_time_filter_with_it(two_batches: tuple[TestClient, datetime]) -> None:
    """The bulk forms carried tenant and reason only: a purge asked from a page filtered by id
    would have purged every entry of the tenant."""
    client, boundary = two_batches
    page = client.get("/dlq?" + urllib.parse.urlencode({"tenant": "acme", "id": "twice"})).text
    form = page.split('action="/dlq/bulk"')[2].split("</form>")[0]  # the purge form
    assert 'name="id" value="twice"' in form and 'name="tenant" value="acme"' in form
    csrf = _csrf(page)
    asked = client.post("/dlq/bulk", data={"csrf": csrf, "op": "purge", "tenant": "acme", "id": "twice"})
    assert asked.status_code == 200 and "Purge 2 DLQ entries" in asked.text, asked.text
    upto = re.search(r'name="upto" value="(\d+)"', asked.text)
    assert upto and 'name="id" value="twice"' in asked.text
    fields = {"csrf": csrf, "op": "purge", "tenant": "acme", "id": "twice", "confirm": "yes", "upto": upto[1]}
    assert "2 DLQ entries deleted" in client.post("/dlq/bulk", data=fields).text
    assert sorted(_listed(client)) == [("acme", "a-1"), ("acme", "a-2"), ("acme", "b-1"), ("globex", "twice")]
    later = {"csrf": csrf, "op": "purge", "tenant": "acme", "from": boundary.isoformat()}
    assert "Purge 1 DLQ entry" in client.post("/dlq/bulk", data=later).text


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"from": "yesterday"}, "from: not a time: 'yesterday'"),
        ({"to": "2026-13-45T99:00Z"}, "to: not a time"),
        ({"from": "x" * 5000}, "from: not a time"),
        ({"from": "2026-12-02T10:00Z", "to": "2026-12-02T09:00Z"}, "from: must be before to"),
        ({"from": "2026-12-02T09:00Z", "to": "2026-12-02T09:00Z"}, "from: must be before to"),
        ({"reason": "<script>alert(1)</script>"}, "reason: not a reason code"),
        ({"tenant": 'ac"me<b>'}, "tenant: not a tenant id"),
        ({"id": "é" * 201}, "id: a serviceCallId is at most 200 characters, not 201"),
        ({"after": "9" * 40}, "after: a DLQ sequence"),
    ],
)
def test_a_filter_that_is_not_one_is_a_line_on_the_page(
    settings: Settings, params: dict[str, str], said: str
) -> None:
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as client:
        page = client.get("/dlq?" + urllib.parse.urlencode(params), headers=BEARER)
        api = client.get("/api/v1/dlq?" + urllib.parse.urlencode(params), headers=BEARER)
    assert page.status_code == 400 and api.status_code == 400, (page.text, api.text)
    (error,) = re.findall(r'<p class="bad" role="alert" id="error">(.*?)</p>', page.text, re.S)
    assert said in error.replace("&#39;", "'") and "\n" not in error and len(error) < 400, error
    body = page.text.split("<main>")[1]
    assert "<script>alert" not in body and "<b>" not in body and "Traceback" not in body
    assert said in api.json()["error"] and "\n" not in api.json()["error"]


def test_a_hostile_id_is_shown_back_escaped_and_matches_nothing(settings: Settings) -> None:
    sid = "\"'><script>alert(1)</script>é☃" + "x" * 150
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as client:
        page = client.get("/dlq?" + urllib.parse.urlencode({"id": sid}), headers=BEARER)
    assert page.status_code == 200 and "no entries" in page.text
    assert "<script>alert" not in page.text.split("<main>")[1]
    assert "&#34;&#39;&gt;&lt;script&gt;" in page.text and "é☃" in page.text
