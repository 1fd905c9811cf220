"""The plans the hot statements depend on (their comments in sql/queries.sql say why): a planner
change, an index dropped or a rewrite that loses them fails here, not in production at 1 s a mark.

Whatever the statistics and cost settings: at 50,000 rows with the default random_page_cost the
key joins the claim and the mark once made went to a sequential scan and a hash join, at 200,000
rows only once leases were rare in the statistics, and on SSD costs (1.1) not at all."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from worker.adapters.queries import QUERIES

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
    """Every node of the statement's plan, flattened."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(f"SET random_page_cost = {cost}")
        ((doc,),) = conn.execute(f"EXPLAIN (FORMAT JSON) {QUERIES[name]}", params).fetchall()
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


@pytest.mark.parametrize("name", ["mark_fired", "retry_later"])
def test_a_full_batch_is_recorded_through_its_row_ids(
    seeded: tuple[str, float, list[str]], name: str
) -> None:
    db_url, cost, row_ids = seeded
    n = len(row_ids)
    params: dict[str, Any] = {"row_id": row_ids, "lease_token": [7] * n}
    if name == "mark_fired":
        params |= {"due_at": [datetime.now(UTC)] * n, "next_due_at": None, "next_index": None}
    else:
        params |= {"error": ["publish: TimeoutError"] * n, "backoff_ms": [1000] * n, "owner": None}
    found = scans(plan(db_url, cost, name, params))
    assert found == {("Tid Scan", "")}, f"{name} reads timers by {found}"


def test_claim_due_reads_only_the_due_index_and_its_rows_by_id(seeded: tuple[str, float, list[str]]) -> None:
    db_url, cost, _ = seeded
    nodes = plan(
        db_url,
        cost,
        "claim_due",
        {
            "owner": "r",
            "ahead_ms": 100,
            "fresh_window_ms": 2000,
            "oldest_limit": 1000,
            "fresh_limit": 50,
            "lease_ms": 3000,
            "downtime_ms": 5000,
        },
    )
    found = scans(nodes)
    assert {s for s in found if s[1] == "timers_due"}, f"claim_due does not walk the due index: {found}"
    assert found <= {("Index Scan", "timers_due"), ("Index Only Scan", "timers_due"), ("Tid Scan", "")}, (
        f"claim_due reads timers by {found}"
    )
