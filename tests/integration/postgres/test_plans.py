"""The plans the hot statements depend on (docs/SQL.md says why): a planner
change, an index dropped or a rewrite that loses them fails here, not in production at 1 s a record.

Whatever the statistics and cost settings: at 50,000 rows with the default random_page_cost the
key joins the claim and the record once made went to a sequential scan and a hash join, at 200,000
rows only once leases were rare in the statistics, and on SSD costs (1.1) not at all. And whatever
the heap order: on a table whose rows are not stored in due order, as months of scheduling leave
it, the claim went to a bitmap scan and a sort with a few rows due (issue 36), and read and sorted
every due row after a burst its statistics had not seen (issue 37)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from tests.helpers import insert_due
from tools.bench.realistic import build_realistic
from worker.adapters.postgres import db
from worker.adapters.postgres.claim import Batch
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.store import Store
from worker.core.domain import ClaimParams, Fired

LEASED = 1000
SHAPES = [(50_000, 4.0), (50_000, 1.1), (200_000, 4.0)]  # rows, random_page_cost


@pytest.fixture(params=SHAPES, ids=[f"{r}-rows-rpc-{c}" for r, c in SHAPES])
def seeded(request: pytest.FixtureRequest, db_url: str) -> tuple[str, float, list[str]]:
    """Scheduled timers, statistics taken on them, then a thousand of them claimed: as in
    production, where the statistics seldom see a lease (autovacuum analyzes between claims).
    Returns the database, its random_page_cost, and the claimed rows' ids (ctid)."""
    rows, cost = request.param
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
            " SELECT 't' || (i %% 50), 'k' || i, 'Scheduled', now() + i * interval '1 second',"
            "  now() + i * interval '1 second'"
            " FROM generate_series(1, %(rows)s) i",
            {"rows": rows},
        )
        conn.execute("ANALYZE timers")
        leased = conn.execute(
            "UPDATE timers SET lease_owner = 'r', lease_token = 7,"
            " lease_expires_at = now() + interval '1 minute' WHERE service_call_id = ANY(%(keys)s)"
            " RETURNING ctid::text",
            {"keys": [f"k{i}" for i in range(1, LEASED + 1)]},
        ).fetchall()
    return db_url, cost, [r[0] for r in leased]


def plan(db_url: str, cost: float, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of the statement's plan in the claim's transaction (claim_begin: claim_due,
    record_fired and retry_later all run in it), flattened."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"SET random_page_cost = {cost}")
        conn.execute(QUERIES["claim_begin"])
        ((doc,),) = conn.execute(f"EXPLAIN (FORMAT JSON) {QUERIES[name]}", params).fetchall()
        conn.execute("ROLLBACK")
    nodes, todo = [], [doc[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    return nodes


def scans(nodes: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """How each node reading timers reads it: (node type, index)."""
    return {
        (n["Node Type"], n.get("Index Name", ""))
        for n in nodes
        if n.get("Relation Name") == "timers" and n["Node Type"] != "ModifyTable"
    }


@pytest.mark.parametrize("name", ["record_fired", "retry_later"])
def test_a_full_batch_is_recorded_through_its_row_ids(
    seeded: tuple[str, float, list[str]], name: str
) -> None:
    db_url, cost, row_ids = seeded
    n = len(row_ids)
    params: dict[str, Any] = {"row_id": row_ids, "lease_token": [7] * n}
    if name == "record_fired":
        params |= {"due_at": [datetime.now(UTC)] * n, "next_due_at": None, "next_index": None}
        params |= {"next_nominal": None, "unfired": None}  # 0016's: NULL arrays, as nearly always
    else:
        params |= {"error": ["publish: TimeoutError"] * n, "backoff_ms": [1000] * n, "owner": None}
    found = scans(plan(db_url, cost, name, params))
    assert found == {("Tid Scan", "")}, f"{name} reads timers by {found}"


CLAIM = {
    "owner": "r",
    "ahead_ms": 100,
    "fresh_window_ms": 2000,
    "oldest_limit": 1000,
    "fresh_limit": 50,
    "lease_ms": 3000,
    "downtime_ms": 5000,
    "catchup_max": 99,
}


def test_claim_due_reads_only_the_due_index_and_its_rows_by_id(seeded: tuple[str, float, list[str]]) -> None:
    db_url, cost, _ = seeded
    assert_walks_the_due_index(plan(db_url, cost, "claim_due", CLAIM))


UNORDERED_ROWS = 100_000  # the plan flipped from here up (and at 5,000,000, issue 36)
# (rows due now, whether the statistics saw them): a claim's worth in steady state, and a burst
# inserted after the last ANALYZE (issue 37: the planner expected a few hundred due rows).
DUE_NOW = [(30, True), (50_000, False)]


@pytest.mark.parametrize(("due", "analyzed"), DUE_NOW, ids=["few-due", "burst-stale-statistics"])
@pytest.mark.parametrize("cost", [4.0, 1.1], ids=["rpc-4.0", "rpc-1.1"])
def test_claim_due_walks_the_due_index_whatever_the_heap_order(
    db_url: str, due: int, analyzed: bool, cost: float
) -> None:
    build_realistic(db_url, UNORDERED_ROWS, tenants=1000)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
            " SELECT 'tenant-' || (i %% 1000), 'due-' || i, 'Scheduled', d, d"
            " FROM generate_series(1, %(due)s) i, LATERAL (SELECT now() - i * interval '1 ms') t(d)",
            {"due": due},
        )
        if analyzed:
            conn.execute("ANALYZE timers")
    assert_walks_the_due_index(plan(db_url, cost, "claim_due", CLAIM))


def assert_walks_the_due_index(nodes: list[dict[str, Any]]) -> None:
    found = scans(nodes)
    assert {s for s in found if s[1] == "timers_due"}, f"claim_due does not walk the due index: {found}"
    assert found <= {("Index Scan", "timers_due"), ("Index Only Scan", "timers_due"), ("Tid Scan", "")}, (
        f"claim_due reads timers by {found}"
    )


async def test_a_claims_transaction_plans_with_the_claims_settings(db_url: str) -> None:
    """Store.claim opens its transaction with claim_begin, so the plans above are the claim's: its
    settings hold in the batch's transaction, until the batch is recorded, and no further."""
    insert_due(db_url, "k1")
    async with db.pool(db_url, "plans", min_size=1, max_size=1, idle_in_transaction_ms=60_000) as pool:
        store = Store(pool)
        params = ClaimParams("r", 10, 1, 30_000, 100, 2000, 5000)
        batch = await store.claim(params)
        assert [c.service_call_id for c in batch.result.claimed] == ["k1"]
        assert isinstance(batch, Batch)
        conn = batch._conn  # the batch's own session, in its transaction
        assert conn is not None
        settings = "SELECT current_setting('enable_bitmapscan'), current_setting('enable_sort')"
        assert await (await conn.execute(settings)).fetchall() == [("off", "off")]
        await batch.record([Fired(c, None, None) for c in batch.result.claimed], [])
        async with pool.connection() as conn:  # the same session, the transaction over
            assert await (await conn.execute(settings)).fetchall() == [("on", "on")]


def test_a_run_of_pauses_and_resumes_reads_its_timers_by_key(seeded: tuple[str, float, list[str]]) -> None:
    """control_timers, for a burst of one-timer pauses and resumes of many tenants (intake's run):
    each timer read through the primary key, never a scan of the table."""
    db_url, cost, _ = seeded
    n = 2000
    params = {
        "tenant_id": [f"t{i % 50}" for i in range(n)],
        "service_call_id": [f"k{i}" for i in range(n)],
        "resume": [i % 2 == 0 for i in range(n)],
        "control_seq": list(range(n)),
        "control_stored_at": [datetime.now(UTC)] * n,
        "terms": None,
    }
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"SET random_page_cost = {cost}")
        ((doc,),) = conn.execute(f"EXPLAIN (FORMAT JSON) {QUERIES['control_timers']}", params).fetchall()
    nodes, todo = [], [doc[0]["Plan"]]
    while todo:
        node = todo.pop()
        nodes.append(node)
        todo.extend(node.get("Plans", []))
    found = scans(nodes)
    assert found <= {("Index Scan", "timers_pkey"), ("Index Only Scan", "timers_pkey")}, (
        f"control_timers reads timers by {found}"
    )
