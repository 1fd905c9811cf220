"""The plans the hot statements depend on (their comments in sql/queries.sql say why): a planner
change, an index dropped or a rewrite that loses them fails here, not in production at 1 s a mark."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from worker.adapters.queries import QUERIES

ROWS = 200_000  # the table size at which mark_fired once went to a sequential scan
LEASED = 1000


@pytest.fixture
def seeded(db_url: str) -> str:
    """200,000 Scheduled timers, statistics taken on them, then a thousand of them claimed: as in
    production, where the statistics seldom see a lease (autovacuum analyzes between claims)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
            " SELECT 't' || (i %% 50), 'k' || i, 'Scheduled', now() + i * interval '1 second',"
            "  now() + i * interval '1 second'"
            " FROM generate_series(1, %(rows)s) i",
            {"rows": ROWS},
        )
        conn.execute("ANALYZE timers")
        conn.execute(
            "UPDATE timers SET lease_owner = 'r', lease_token = 7,"
            " lease_expires_at = now() + interval '1 minute' WHERE service_call_id = ANY(%(keys)s)",
            {"keys": [f"k{i}" for i in range(1, LEASED + 1)]},
        )
    return db_url


def plan(db_url: str, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of the statement's plan, flattened."""
    with psycopg.connect(db_url, autocommit=True) as conn:
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


def test_mark_fired_goes_through_the_primary_key_for_a_full_batch(seeded: str) -> None:
    keys = range(1, LEASED + 1)
    nodes = plan(
        seeded,
        "mark_fired",
        {
            "tenant_id": [f"t{i % 50}" for i in keys],
            "service_call_id": [f"k{i}" for i in keys],
            "lease_token": [7] * LEASED,
            "due_at": [datetime.now(UTC)] * LEASED,
            "next_due_at": None,
            "next_index": None,
        },
    )
    found = scans(nodes)
    assert found <= {("Index Scan", "timers_pkey")}, f"mark_fired scans timers by {found}"
    assert found, "mark_fired does not read timers through an index"


def test_claim_due_reads_only_the_due_index(seeded: str) -> None:
    nodes = plan(
        seeded,
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
    index_reads = {s for s in found if s[1] == "timers_due"}
    assert index_reads, f"claim_due does not walk the due index: {found}"
    assert all(kind != "Seq Scan" for kind, _ in found), f"claim_due scans timers sequentially: {found}"
