"""`list --state Paused`: one tenant's paused timers, and every tenant's (worker/ops/reads.py), the
timers to resume before a rollback (README)."""

from __future__ import annotations

import json
from typing import Any

from tests.helpers import query
from tests.integration.ops.test_cli import run
from tests.integration.ops.test_reads import _all_pages, _insert
from worker.adapters.postgres.queries import QUERIES
from worker.ops import reads


def test_cli_lists_paused_timers_of_one_tenant_and_of_every_tenant(db_url: str) -> None:
    for tenant in ("acme", "beta"):
        _insert(db_url, tenant, 3, state="Paused", prefix="p-")
        _insert(db_url, tenant, 2, prefix="s-")
    env = {"TIMER_DATABASE_URL": db_url}
    one = run("list", "--tenant", "acme", "--state", "paused", "--json", **env)
    assert one.returncode == 0, one.stderr
    assert [t["serviceCallId"] for t in json.loads(one.stdout)["timers"]] == ["p-0000", "p-0001", "p-0002"]
    every = run("list", "--state", "Paused", "--limit", "2", "--json", **env)
    assert every.returncode == 0, every.stderr
    first = json.loads(every.stdout)
    assert [(t["tenantId"], t["serviceCallId"], t["state"]) for t in first["timers"]] == [
        ("acme", "p-0000", "Paused"),
        ("acme", "p-0001", "Paused"),
    ]
    rest = run("list", "--state", "Paused", "--after", first["next"], "--json", **env)
    assert [t["serviceCallId"] for t in json.loads(rest.stdout)["timers"]] == [
        "p-0002",
        "p-0000",
        "p-0001",
        "p-0002",
    ]
    refused = run("list", "--state", "Reached", **env)
    assert refused.returncode == 2 and "Scheduled or Paused timers only: give a tenant" in refused.stderr


def test_paging_every_tenants_paused_timers_returns_each_once(db_url: str) -> None:
    """Paging by (tenant, id) across tenants, pages smaller than a tenant's timers."""
    for tenant in ("a", "b", "c"):
        _insert(db_url, tenant, 7, state="Paused")
        _insert(db_url, tenant, 3, prefix="s-")
    seen = _all_pages(db_url, reads.TimerFilter(state="Paused"), limit=4)
    assert seen == [(t, f"sc-{i:04d}") for t in ("a", "b", "c") for i in range(7)]


def test_every_tenants_paused_timers_walk_the_paused_index(db_url: str) -> None:
    """A page costs the rows it reads, however many timers are not paused."""
    for t in range(20):
        _insert(db_url, f"t{t}", 1000)
    _insert(db_url, "t7", 50, state="Paused", prefix="p-")
    query(db_url, "ANALYZE timers")
    args: dict[str, Any] = {"after_tenant": "", "after_id": "", "due_from": None, "due_to": None, "limit": 50}
    with reads.connect(db_url) as conn:
        explain = b"EXPLAIN " + QUERIES["inspect_paused_timers"].encode()
        plan = "\n".join(r[0] for r in conn.execute(explain, args))  # type: ignore[call-overload]
    assert "timers_paused" in plan and "Seq Scan" not in plan, plan
