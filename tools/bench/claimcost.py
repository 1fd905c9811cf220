"""What one claim costs Postgres on each table shape, node by node, and an index's share of it.

For each round, shape and variant (as migrated, or `--without` an index), a fresh database built
to the shape, then `--claims` claims in a row, each claim_due under EXPLAIN (ANALYZE, BUFFERS, WAL)
and committed: per 1,000 claimed, its time, its index scan (and what of it came before the first
due row), its UPDATE, buffers and WAL. Medians; variants alternate round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

import psycopg

from tools.bench.report import brief, medians, on_servers, parser, positive
from tools.bench.rig import Rig
from tools.bench.shapes import SHAPES, TIMERS, add_timers, build
from worker.adapters.postgres.claim import claim_due_params
from worker.adapters.postgres.queries import QUERIES
from worker.core.domain import LOOKAHEAD_MS, ClaimParams
from worker.core.firing import FRESH_LANE_WINDOW_MS

PROG = "python -m tools.bench.claimcost"
# Bench-only: the indexes a variant may go without.
DROPS = {
    "timers_pkey": "ALTER TABLE timers DROP CONSTRAINT timers_pkey",
    "timers_done": "DROP INDEX timers_done",
    "timers_correlation": "DROP INDEX timers_correlation",
}
LEASE_MS = 30_000
DOWNTIME_MS = 60_000


def _node(plan: dict[str, Any], match: str) -> dict[str, Any]:
    """The first node of EXPLAIN's JSON `plan` whose type and relation or index read as `match`."""
    label = f"{plan.get('Node Type')} {plan.get('Index Name', plan.get('Relation Name', ''))}"
    if label.startswith(match):
        return plan
    for child in plan.get("Plans", ()):
        found = _node(child, match)
        if found:
            return found
    return {}


def claim_cost(conn: psycopg.Connection[Any], limit: int) -> dict[str, float]:
    """One claim of up to `limit`, explained and committed: its costs per 1,000 claimed."""
    conn.execute(QUERIES["claim_begin"])
    main_lane = ClaimParams(  # a replica's main lane: the oldest only
        owner="claimcost",
        limit=limit,
        fresh_limit=0,
        lease_ms=LEASE_MS,
        ahead_ms=LOOKAHEAD_MS,
        fresh_window_ms=FRESH_LANE_WINDOW_MS,
        downtime_ms=DOWNTIME_MS,
    )
    params = claim_due_params(main_lane)
    row = conn.execute(
        "EXPLAIN (ANALYZE, BUFFERS, WAL, FORMAT JSON) " + QUERIES["claim_due"], params
    ).fetchone()
    conn.execute("COMMIT")
    assert row is not None
    top = row[0][0]
    plan = top["Plan"]
    update = _node(plan, "ModifyTable timers")
    scan = _node(plan, "Index Scan timers_due")
    claimed = update.get("Actual Rows", 0)
    if not claimed:
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


async def run(admin_url: str, nats_url: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    variants = ["as migrated", *(f"without {name}" for name in args.without)]
    samples: dict[str, dict[str, list[dict[str, float]]]] = {
        s: {v: [] for v in variants} for s in args.shapes
    }
    pages: dict[str, int] = {}
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]  # a slow moment falls on each in turn
        for shape in args.shapes:
            for variant in order:
                async with Rig(admin_url, nats_url, workdir) as rig:
                    if variant != "as migrated":
                        await rig.db_.execute(DROPS[variant.removeprefix("without ")])
                    pages[shape] = await asyncio.to_thread(
                        build, shape, rig.db_url, add_timers(rig.db_url), TIMERS, args.due, args.big
                    )
                    with psycopg.connect(rig.db_url) as conn:
                        claims = [c for c in (claim_cost(conn, args.limit) for _ in range(args.claims)) if c]
                    samples[shape][variant] += claims
                    last = brief(claims[-1], "{:.1f}".format) if claims else "nothing claimed"
                    print(
                        f"[claimcost {r + 1}/{args.rounds}] {shape}, {variant}: {last}",
                        file=sys.stderr,
                        flush=True,
                    )
    median = {shape: {v: medians(cs) if cs else {} for v, cs in by.items()} for shape, by in samples.items()}
    return {"config": vars(args), "due_pages": pages, "median": median}


def main(argv: list[str] | None = None) -> int:
    p = parser(PROG, __doc__)
    p.add_argument("--shapes", nargs="+", choices=SHAPES, default=["scattered", "fresh"])
    p.add_argument(
        "--without", nargs="*", choices=sorted(DROPS), default=[], help="variants without an index"
    )
    p.add_argument(
        "--big", type=int, default=500_000, help="pending timers in the big table (default 500,000)"
    )
    p.add_argument("--due", type=int, default=10_000, help="overdue timers (default 10,000)")
    p.add_argument("--claims", type=int, default=8, help="claims in a row per database (default 8)")
    p.add_argument("--limit", type=int, default=1000, help="a claim's limit (default 1,000)")
    p.add_argument("--rounds", type=int, default=3, help="rounds; medians over them (default 3)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not positive(PROG, args, "--big", "--due", "--claims", "--limit", "--rounds"):
        return 2
    result = on_servers(PROG, argv, lambda db, nats, work: run(db, nats, work, args), args.json)
    if isinstance(result, int):
        return result
    keys = ["claimed", "claim_ms", "index_scan_ms", "before_first_due_ms", "update_ms", "buffers"]
    keys += ["wal_records", "wal_fpi", "wal_kb"]
    print("\n| shape | variant | " + " | ".join(keys) + " |\n|---|---|" + "---|" * len(keys))
    for shape, by in result["median"].items():
        for variant, cost in by.items():
            cells = " | ".join(f"{cost.get(k, float('nan')):.1f}" for k in keys)
            print(f"| {shape} | {variant} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
