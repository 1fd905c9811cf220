"""A label selector's reads (worker/adapters/postgres/bulk.py; sql/queries/bulk.sql, select_labelled;
reads.sql, inspect_tenant_timers): through the timers_labels index of the tenant's own terms, so a
rare pair costs its few rows, never the tenant's other timers nor another tenant's carrying the same
labels; and a chunk after a cursor costs its own rows wherever it is in key order. Buffers counted
by EXPLAIN (ANALYZE, BUFFERS), at a tenth of tools/bench/labels.py's scale (docs/BENCHMARKS.md)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tools.bench.labels import EXPLAIN, SEED_SQL, _nodes
from worker.adapters.postgres.bulk import label_terms, plan_listing
from worker.adapters.postgres.queries import QUERIES

ROWS = 100_000
RARE_EVERY = 10_000  # ten timers of the tenant carry the rare pair


@pytest.fixture
def seeded(db_url: str) -> str:
    common = {"tenant": "big", "spread": False, "all_rare": False, "rare_every": RARE_EVERY, "n": ROWS}
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SEED_SQL, common)
        conn.execute(SEED_SQL, common | {"tenant": "other", "spread": True, "all_rare": True})
        conn.execute("VACUUM ANALYZE timers")
    return db_url


def _run(db_url: str, name: str, params: dict[str, Any]) -> tuple[int, int, str]:
    """(rows returned, shared buffers touched, the plan's text) of one run of a named statement."""
    with psycopg.connect(db_url, autocommit=True) as conn, conn.transaction():
        plan_listing(conn, params)  # the plan settings the service's count chooses
        found = conn.execute(EXPLAIN + QUERIES[name], params).fetchone()
    assert found is not None
    plan = found[0]
    top = plan[0]["Plan"]
    return top["Actual Rows"], top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0), _nodes(top)


def _chunk(selector: dict[str, str], after: str = "") -> dict[str, Any]:
    terms = label_terms("big", selector)
    return {"tenant_id": "big", "after": after, "terms": terms, "limit": 1000, "command_seq": None,
            "command_stored_at": None}  # fmt: skip


def _page(selector: dict[str, str], after: str = "") -> dict[str, Any]:
    terms = label_terms("big", selector)
    return {"tenant_id": "big", "after": after, "state": None, "due_from": None, "due_to": None,
            "terms": terms, "limit": 50}  # fmt: skip


@pytest.mark.parametrize(("name", "params"), [("select_labelled", _chunk), ("inspect_tenant_timers", _page)])
def test_a_rare_pair_reads_its_few_rows_through_the_labels_index(seeded: str, name: str, params: Any) -> None:
    """Ten rows of the tenant's 100,000, and 100,000 of other tenants carrying the very same pair:
    the 8.7 s of a GIN index on the labels alone (the planner filtered the tenant's primary key
    range) is a few dozen buffers here."""
    rows, buffers, plan = _run(seeded, name, params({"vip": "yes"}))
    assert rows == 10
    assert "timers_labels" in plan
    assert buffers < 100, (buffers, plan)


@pytest.mark.parametrize("after", ["", f"sc-{ROWS - 3000:08d}"])
def test_a_chunk_of_a_common_pair_costs_its_own_rows_wherever_it_starts(seeded: str, after: str) -> None:
    """Every timer of the tenant carries the common pair: a chunk of 1,000 after the cursor reads
    about its own 1,000 rows, the last chunk no more than the first (no chunk re-reads the ones
    before it: a bulk cancel of 1,000,000 was quadratic that way)."""
    rows, buffers, plan = _run(seeded, "select_labelled", _chunk({"campaign": "bf"}, after))
    assert rows == 1000
    assert buffers < 200, (buffers, plan)
