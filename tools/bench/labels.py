"""What a label selector reads: one tenant's 1,000,000 labelled timers among others' timers
carrying the very same labels.

The tenant `big` holds --rows timers with campaign=bf, one in 100,000 also vip=yes; ten others as
many with both. EXPLAIN (ANALYZE, BUFFERS) of a `list --label` page and a bulk chunk, for the rare
pair and the common one, first and last in key order; then a bulk cancel of the common pair, chunk
by chunk (a selection starting over each chunk would make the last as slow as the whole).
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tools.bench.report import on_servers, parser
from tools.bench.rig import Rig
from worker.adapters.postgres.bulk import label_terms, plan_selection
from worker.adapters.postgres.db import pool
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.store import Store
from worker.core import bulk
from worker.core.bulk import BulkActions, Progress
from worker.core.domain import BulkAction, Position

PROG = "python -m tools.bench.labels"
RARE_EVERY = 100_000
OTHERS = 10
# Bench-only: the timers as intake stores them, labels and all.
SEED_SQL = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, labels)
SELECT %(tenant)s || CASE WHEN %(spread)s THEN (g %% 10)::text ELSE '' END,
       'sc-' || lpad(g::text, 8, '0'), 'Scheduled', now() + interval '1 day', now() + interval '1 day',
       CASE WHEN %(all_rare)s OR g %% %(rare_every)s = 0 THEN '{"campaign": "bf", "vip": "yes"}'::jsonb
            ELSE '{"campaign": "bf"}'::jsonb END
FROM generate_series(1, %(n)s) g
"""
EXPLAIN = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
COUNT_SQL = "SELECT count(*) FROM timers WHERE tenant_id LIKE %s AND state = %s"


def _page_params(tenant: str, selector: dict[str, str], after: str, limit: int) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "after": after,
        "state": None,
        "due_from": None,
        "due_to": None,
        "terms": label_terms(tenant, selector),
        "limit": limit,
    }


def _chunk_params(tenant: str, selector: dict[str, str], after: str) -> dict[str, Any]:
    return {
        "tenant_id": tenant,
        "after": after,
        "terms": label_terms(tenant, selector),
        "limit": bulk.BULK_CHUNK,
        "command_seq": None,
        "command_stored_at": None,
    }


async def _explain(rig: Rig, name: str, params: dict[str, Any]) -> dict[str, Any]:
    """One statement's run: its time, the buffers it touched and the rows it returned."""
    started = time.perf_counter()
    async with rig.db_.transaction():  # planned as the service plans it (bulk.plan_selection)
        await plan_selection(rig.db_, params)
        cur = await rig.db_.execute(EXPLAIN + QUERIES[name], params)
        row = await cur.fetchone()
    assert row is not None
    (plan,) = row[0] if isinstance(row[0], list) else json.loads(row[0])
    top = plan["Plan"]
    buffers = top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)
    total_ms = (time.perf_counter() - started) * 1000  # with the count and the settings
    return {
        "ms": plan["Execution Time"],
        "total_ms": total_ms,
        "buffers": buffers,
        "rows": top["Actual Rows"],
        "plan": _nodes(top),
    }


def _nodes(node: dict[str, Any]) -> str:
    """The plan's node types and indexes, outermost first."""
    here = node["Node Type"] + (f" on {node['Index Name']}" if "Index Name" in node else "")
    return " > ".join([here, *(_nodes(child) for child in node.get("Plans", []))])


async def run(admin_url: str, nats_url: str, workdir: Path, rows: int, with_cancel: bool) -> dict[str, Any]:
    async with Rig(admin_url, nats_url, workdir) as rig:
        started = time.perf_counter()
        common = {"tenant": "big", "spread": False, "all_rare": False, "rare_every": RARE_EVERY, "n": rows}
        await rig.db_.execute(SEED_SQL, common)
        await rig.db_.execute(SEED_SQL, common | {"tenant": "other", "spread": True, "all_rare": True})
        await rig.db_.execute("VACUUM ANALYZE timers")
        seeded_s = time.perf_counter() - started
        last = f"sc-{rows - 2 * bulk.BULK_CHUNK:08d}"
        reads: dict[str, Any] = {}
        for pair, selector in (("rare", {"vip": "yes"}), ("common", {"campaign": "bf"})):
            for where, after in (("first", ""), ("last", last)):
                reads[f"list_{pair}_{where}"] = await _explain(
                    rig, "inspect_tenant_timers", _page_params("big", selector, after, 50)
                )
                reads[f"chunk_{pair}_{where}"] = await _explain(
                    rig, "select_labelled", _chunk_params("big", selector, after)
                )
        cancel = await _bulk_cancel(rig, rows) if with_cancel else None
        left = await rig.scalar(COUNT_SQL, "other%", "Scheduled")
    return {
        "rows": rows,
        "seeded_s": seeded_s,
        "reads": reads,
        "bulk_cancel": cancel,
        "others_untouched": left == rows,
    }


async def _bulk_cancel(rig: Rig, rows: int) -> dict[str, Any]:
    """The common pair cancelled through BulkActions.step, as the bulk lane runs it; each chunk timed."""
    async with pool(rig.db_url, "bench-labels", 1, 2, idle_in_transaction_ms=60_000) as p:
        store = Store(p)
        actions = BulkActions(store)
        timed: list[float] = []
        select = store.select_labelled

        async def timed_select(*args: Any) -> list[str]:
            timed.append(time.perf_counter())
            return await select(*args)

        store.select_labelled = timed_select  # type: ignore[method-assign,assignment]
        where = Position(1, datetime.now(UTC))
        action = BulkAction("big", {"campaign": "bf"}, "cancel")
        started = time.perf_counter()
        progress, steps = Progress(), 0
        while True:
            steps += 1
            done = await actions.step(action, where, progress)
            if done.outcomes[0] != "partial":
                break
        total = time.perf_counter() - started
        timed.append(time.perf_counter())
        chunks = [b - a for a, b in itertools.pairwise(timed)]
    cancelled = await rig.scalar(COUNT_SQL, "big", "Cancelled")
    return {
        "cancelled": cancelled,
        "steps": steps,
        "total_s": total,
        "first_chunk_ms": chunks[0] * 1000,
        "last_chunk_ms": chunks[-2] * 1000 if len(chunks) > 1 else chunks[0] * 1000,
        "median_chunk_ms": sorted(chunks)[len(chunks) // 2] * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    p = parser(PROG, __doc__)
    p.add_argument("--rows", type=int, default=1_000_000, help="the tenant's timers (default 1,000,000)")
    p.add_argument("--reads-only", action="store_true", help="measure the reads, not the bulk cancel")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.rows < 4 * bulk.BULK_CHUNK:
        print(f"{PROG}: --rows must be at least {4 * bulk.BULK_CHUNK}", file=sys.stderr)
        return 2
    result = on_servers(
        PROG, argv, lambda db, nats, work: run(db, nats, work, args.rows, not args.reads_only), args.json
    )
    if isinstance(result, int):
        return result
    print("\n| read | ms | with the count, ms | buffers | rows | plan |\n|---|---|---|---|---|---|")
    for name, r in result["reads"].items():
        print(
            f"| {name} | {r['ms']:.2f} | {r['total_ms']:.2f} | {r['buffers']} | {r['rows']} | {r['plan']} |"
        )
    c = result["bulk_cancel"]
    if c is None:
        return 0
    print(
        f"\nbulk cancel of {c['cancelled']:,} timers: {c['total_s']:.1f} s in {c['steps']} chunks;"
        f" a chunk of {bulk.BULK_CHUNK}: first {c['first_chunk_ms']:.0f} ms,"
        f" median {c['median_chunk_ms']:.0f} ms, last {c['last_chunk_ms']:.0f} ms;"
        f" other tenants untouched: {result['others_untouched']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
