"""What one claim costs Postgres on each table shape, node by node, and an index's share of it."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import psycopg

from tools.bench.report import brief, medians, on_servers, parse, parser, say, table_of
from tools.bench.rig import Rig
from tools.bench.shapes import SHAPES, TIMERS, add_timers, build
from worker.adapters.postgres.claim import claim_due_params
from worker.adapters.postgres.queries import QUERIES
from worker.core.domain import LOOKAHEAD_MS, ClaimParams
from worker.core.firing import FRESH_LANE_WINDOW_MS

# Bench-only: the indexes a variant may go without.
DROPS = {
    "timers_pkey": "ALTER TABLE timers DROP CONSTRAINT timers_pkey",
    "timers_done": "DROP INDEX timers_done",
    "timers_correlation": "DROP INDEX timers_correlation",
}


def _node(plan: dict[str, Any], match: str) -> dict[str, Any]:
    """The first node of EXPLAIN's JSON `plan` whose type and relation or index read as `match`."""
    if f"{plan.get('Node Type')} {plan.get('Index Name', plan.get('Relation Name', ''))}".startswith(match):
        return plan
    return next((found for child in plan.get("Plans", ()) if (found := _node(child, match))), {})


def claim_cost(conn: psycopg.Connection[Any], limit: int) -> dict[str, float]:
    """One main-lane claim of up to `limit`, explained and committed: its costs per 1,000 claimed."""
    conn.execute(QUERIES["claim_begin"])
    params = claim_due_params(
        ClaimParams("claimcost", limit, 0, 30_000, LOOKAHEAD_MS, FRESH_LANE_WINDOW_MS, downtime_ms=60_000)
    )
    row = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + QUERIES["claim_due"], params
    ).fetchone()
    conn.execute("COMMIT")
    assert row is not None
    top = row[0][0]
    plan = top["Plan"]
    update, scan = _node(plan, "ModifyTable timers"), _node(plan, "Index Scan timers_due")
    if not (claimed := update.get("Actual Rows", 0)):
        return {}
    per = 1000 / claimed
    return {
        "claimed": claimed,
        "claim_ms": top["Execution Time"] * per,
        "index_scan_ms": scan.get("Actual Total Time", 0.0) * per,
        "before_first_due_ms": scan.get("Actual Startup Time", 0.0) * per,
        "update_ms": (update["Actual Total Time"] - update["Actual Startup Time"]) * per,
        "buffers": (plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]) * per,
        "wal_records": plan["WAL Records"] * per,
        "wal_fpi": plan["WAL FPI"] * per,
        "wal_kb": plan["WAL Bytes"] / 1024 * per,
    }


async def run(admin_url: str, nats_url: str, workdir: Any, args: argparse.Namespace) -> dict[str, Any]:
    variants = ["as migrated", *(f"without {name}" for name in args.without)]
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        s: {v: [] for v in variants} for s in args.shapes
    }
    pages: dict[str, int] = {}
    for r in range(args.rounds):
        for shape in args.shapes:
            for variant in variants[:: 1 if r % 2 == 0 else -1]:  # a slow moment falls on each in turn
                async with Rig(admin_url, nats_url, workdir) as rig:
                    if variant != "as migrated":
                        await rig.db_.execute(DROPS[variant.removeprefix("without ")])
                    pages[shape] = await asyncio.to_thread(
                        build, shape, rig.db_url, add_timers(rig.db_url), TIMERS, args.due, args.big
                    )
                    with psycopg.connect(rig.db_url) as conn:
                        claims = [c for _ in range(args.claims) if (c := claim_cost(conn, args.limit))]
                samples[shape][variant] += claims
                last = brief(claims[-1], "{:.1f}".format) if claims else "nothing claimed"
                say(f"claimcost {r + 1}/{args.rounds}", f"{shape}, {variant}: {last}")
    median = {shape: {v: medians(cs) if cs else {} for v, cs in by.items()} for shape, by in samples.items()}
    return {"config": vars(args), "due_pages": pages, "median": median}


def main(argv: list[str] | None = None) -> int:
    counts = {"big": (500_000, "pending timers in the big table"), "due": (10_000, "overdue timers")}
    counts |= {"claims": (8, "claims in a row per database"), "limit": (1000, "a claim's limit")}
    p = parser(
        "python -m tools.bench.claimcost", __doc__, counts | {"rounds": (3, "rounds; medians over them")}
    )
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=["scattered", "fresh"])
    p.add_argument(
        "--without", nargs="*", choices=sorted(DROPS), default=[], help="variants without an index"
    )
    if (args := parse(p, argv)) is None:
        return 2
    result = on_servers(p, argv, args, lambda db, nats, work: run(db, nats, work, args))
    if isinstance(result, dict):
        print(table_of({f"{s}, {v}": c for s, by in result["median"].items() for v, c in by.items()}))
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
