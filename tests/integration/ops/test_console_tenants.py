"""Every tenant in the console (worker/ops/tenants.py, worker/ops/console/tenant_views.py): paged by
name and by pending timers, searched by prefix, linked from the overview; what a page reads does
not grow with the tenants' timers; hostile input is one escaped line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.helpers import query
from tests.integration.ops.test_console import TOKEN, console_settings
from worker.adapters.postgres.queries import QUERIES
from worker.config import Settings
from worker.ops import reads, tenants
from worker.ops.console.app import create_app


def _seed(db_url: str, per_tenant: dict[str, int], state: str = "Scheduled") -> None:
    """`n` timers of each tenant, in one statement per tenant (intake's trigger counts them)."""
    for tenant, n in per_tenant.items():
        query(
            db_url,
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
            "SELECT %s, 'sc-' || i, %s, now() + interval '1 hour' FROM generate_series(1, %s) AS i",
            tenant,
            state,
            n,
        )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(console_settings(settings)), follow_redirects=False) as c:
        # Logged in without a look at the overview: its counts would be kept from before the seed.
        assert c.post("/login", data={"token": TOKEN}).status_code == 303
        yield c


def _walk_pages(client: TestClient, first: str) -> list[str]:
    """The tenants every page lists, following the pages' `Next page` links from `first`."""
    seen: list[str] = []
    url: str | None = first
    while url is not None:
        page = client.get(url)
        assert page.status_code == 200, page.text
        table = page.text.split('id="tenants"')[1].split("</table>")[0]
        seen += re.findall(r'<a href="/tenants/[^"]+">([^<]+)</a>', table)
        nxt = re.search(r'<a href="(/tenants\?[^"]+)" rel="next">', page.text)
        url = nxt.group(1).replace("&amp;", "&") if nxt else None
    return seen


def test_every_tenant_is_listed_page_by_page_by_name_and_by_pending(client: TestClient, db_url: str) -> None:
    """120 tenants: more than the overview's ten and than a page's fifty."""
    sizes = {f"t{i:03d}": (i * 7) % 13 + 1 for i in range(120)}
    _seed(db_url, sizes)
    _seed(db_url, {"finished": 4}, state="Reached")  # no pending timer: by name only
    overview = client.get("/").text
    assert '<a href="/tenants" id="all-tenants">All 121 tenants</a>' in overview

    by_name = _walk_pages(client, "/tenants")
    assert by_name == sorted([*sizes, "finished"])

    by_pending = _walk_pages(client, "/tenants?sort=pending")
    assert by_pending == sorted(sizes, key=lambda t: (-sizes[t], t))
    first = client.get("/tenants?sort=pending").text
    assert f"<td>{sizes[by_pending[0]]}</td>" in first  # the bound, which is exact for these

    prefixed = _walk_pages(client, "/tenants?prefix=t10")
    assert prefixed == [f"t{i}" for i in range(100, 110)]
    assert _walk_pages(client, "/tenants?sort=pending&prefix=t11") == sorted(
        [f"t{i}" for i in range(110, 120)], key=lambda t: (-sizes[t], t)
    )


def test_a_search_by_name_walks_a_bounded_number_of_tenants_and_goes_on_from_there(db_url: str) -> None:
    """The tenants of a prefix need not be next to each other under another collation than C, so a
    search walks on: at most `walk` tenants a look, then the page goes on from where it stopped."""
    _seed(db_url, {"a-b0": 1, "ab0": 1, "a-b1": 1, "ac": 1, "ad": 1, "ae": 1, "b": 1})
    with reads.connect(db_url) as conn:
        page = tenants.tenants_page(conn, "name", "a-b", walk=10)
        assert [t["tenant"] for t in page.tenants] == ["a-b0", "a-b1"]  # C: a-b0, a-b1, ab0, ...
        assert page.walked_to is None and page.next_cursor is None  # every tenant walked
        cut = tenants.tenants_page(conn, "name", "a", limit=50, walk=3)
        assert [t["tenant"] for t in cut.tenants] == ["a-b0", "a-b1", "ab0"] and cut.walked_to == "ab0"
        rest = tenants.tenants_page(conn, "name", "a", after=cut.next_cursor, walk=3)
        assert [t["tenant"] for t in rest.tenants] == ["ac", "ad", "ae"] and rest.walked_to == "ae"
        end = tenants.tenants_page(conn, "name", "a", after=rest.next_cursor, walk=3)
        assert end.tenants == [] and end.next_cursor is None  # "b" is walked, not listed


def _buffers(conn: Any, statement: str, params: dict[str, Any]) -> int:
    """Shared buffers `statement` touched, as EXPLAIN (ANALYZE, BUFFERS) counts them."""
    (plan,) = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, params, prepare=False
    ).fetchone()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return int(top["Shared Hit Blocks"]) + int(top["Shared Read Blocks"])


def test_a_page_of_tenants_reads_no_more_when_a_tenant_holds_many_more_timers(db_url: str) -> None:
    """A GROUP BY over timers (as status_top_tenants) reads every row: 50,000 more timers would be
    hundreds of pages more. The walk and the bounds read a few index pages per tenant."""
    _seed(db_url, {f"t{i}": 5 for i in range(10)})
    by_name = {"prefix": "", "after": "", "scan": tenants.MAX_WALK, "limit": 51}
    by_pending = {"prefix": "", "after_pending": 2**62, "after_tenant": "", "limit": 51}
    query(db_url, "VACUUM ANALYZE timers")
    with reads.connect(db_url) as conn:
        before = [
            _buffers(conn, QUERIES["console_tenants_by_name"], by_name),
            _buffers(conn, QUERIES["console_tenants_by_pending"], by_pending),
        ]
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "SELECT 't5', 'big-' || i, 'Scheduled', now() + interval '1 hour' "
        "FROM generate_series(1, 50000) AS i",
    )
    query(db_url, "VACUUM ANALYZE timers")
    with reads.connect(db_url) as conn:
        after = [
            _buffers(conn, QUERIES["console_tenants_by_name"], by_name),
            _buffers(conn, QUERIES["console_tenants_by_pending"], by_pending),
        ]
        whole = _buffers(conn, QUERIES["status_top_tenants"], {"top": 10})
    # Deeper index: at most one more page per probe (11 tenants walked); the table has ~400 pages.
    assert after[0] <= before[0] + 2 * 11, (before, after)
    assert after[1] <= before[1] + 5, (before, after)
    assert whole > 10 * after[0], (whole, after)  # the yardstick: a count does read them


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/tenants?prefix=%3Cscript%3Ealert(1)%3C/script%3E", "a tenant prefix is the start of a tenant id"),
        ("/tenants?prefix=" + "a" * 65, "a tenant prefix is the start of a tenant id"),
        ("/tenants?prefix=caf%C3%A9%22%27", "a tenant prefix is the start of a tenant id"),
        ("/tenants?sort=%3Cb%3E", "sort: one of name, pending"),
        ("/tenants?after=not-a-cursor", "not a cursor"),
        ("/tenants?sort=pending&after=WyJ4Il0", "not a cursor"),  # ["x"]: a name cursor
        ("/tenants?after=" + "A" * 5000, "not a cursor"),
    ],
)
def test_hostile_input_on_the_tenants_page_is_one_escaped_line(
    client: TestClient, db_url: str, path: str, said: str
) -> None:
    _seed(db_url, {"acme": 1})
    page = client.get(path)
    assert page.status_code == 400, page.text
    (error,) = re.findall(r'<p class="bad" role="alert" id="error">(.*?)</p>', page.text, re.S)
    assert said in error and "\n" not in error and len(error) < 300, error
    assert "<script>" not in page.text.split("<main>")[1] and "<b>" not in page.text.split("<main>")[1]
    assert "Traceback" not in page.text
