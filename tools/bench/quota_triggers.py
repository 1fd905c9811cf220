"""What the quota's triggers (migration 0014) cost the firing path: the same work with them enabled
and disabled (`ALTER TABLE timers DISABLE TRIGGER USER`), in turns whose order alternates round by
round, on one embedded Postgres (and NATS). Run from the repository's root:

    python -m tools.bench.quota_triggers claim --timers 50000 --tenants 1000 --rounds 6
    python -m tools.bench.quota_triggers drain --scale 0.1 --rounds 3

  * claim: claim_due alone on one connection until the seeded overdue one-shot timers are all
    claimed (each claim records them fired): the backend's CPU per 1,000 fires, from /proc.
  * drain: the `drain` scenario (three replicas claim, publish, mark): Postgres' CPU per 1,000
    fires (every process of the server, from /proc) from the replicas' start to the last event.

`--old FILE` replaces 0014 with another version of it first (the statement triggers of h-quota:
`git show 1e2b43a:sql/migrations/0014_tenant_pending.sql > old.sql`). Medians, the ratio, and the
calibration loop before and after (docs/BENCHMARKS.md, the quota's bound).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from tools.bench import scenarios
from tools.bench.calibrate import calibrate, describe
from tools.bench.context import Context
from tools.bench.rig import Rig
from worker.adapters.postgres.migrations import migrate
from worker.adapters.postgres.queries import QUERIES
from worker.devkit.dev import servers

SEED = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)
SELECT 't' || (i %% %(tenants)s), 'k-' || md5(i::text), 'Scheduled', d, d
FROM generate_series(0, %(n)s - 1) AS i,
     LATERAL (SELECT now() - interval '1 hour' + i * interval '1 millisecond') AS x(d)
"""
CLAIM = {
    "owner": "ab",
    "ahead_ms": 0,
    "fresh_window_ms": 2000,
    "oldest_limit": 900,
    "fresh_limit": 100,
    "lease_ms": 30_000,
    "downtime_ms": 60_000,
}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int, children: bool = False) -> float:
    """CPU seconds of the process `pid` so far; with `children`, of every process it started too."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat") if children else [Path(f"/proc/{pid}/stat")]:
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat.parent.name) == pid:
            total += sum(int(f) for f in fields[11:15]) / TICK
        elif int(fields[1]) == pid:
            total += (int(fields[11]) + int(fields[12])) / TICK
    return total


def replace_0014(url: str, old: str | None) -> None:
    """Put another version of migration 0014 in place of this one (none: leave it)."""
    if old:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE tenant_pending CASCADE")
            conn.execute("DROP FUNCTION timers_count_inserted, timers_count_revived CASCADE")
            conn.execute(old.encode())


def set_triggers(url: str, on: bool) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE timers {'ENABLE' if on else 'DISABLE'} TRIGGER USER")


def claim_round(url: str, n: int, tenants: int, on: bool) -> float:
    """Backend CPU ms per 1,000 one-shot fires claimed."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE timers, tenant_pending")
        set_triggers(url, on)
        conn.execute(SEED, {"n": n, "tenants": tenants})
        conn.execute("VACUUM ANALYZE timers")
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        before, fired = cpu_s(row[0]), 0
        while True:
            with conn.transaction():
                got = len(conn.execute(QUERIES["claim_due"], CLAIM).fetchall())
            if got <= 1:  # the one row of a claim that took nothing
                return (cpu_s(row[0]) - before) / fired * 1e6
            fired += got


def drain_round(
    url: str, nats_url: str, workdir: Path, scale: float, postmaster: int, on: bool, old: str | None
) -> float:
    """Postgres CPU ms per 1,000 fires of the drain scenario."""
    seen: dict[str, float] = {}
    seed, start, events = Rig.seed, Rig.start_replicas, Rig.events_state

    async def seed_then(self: Rig, n: int, **kw: Any) -> None:
        replace_0014(self.db_url, old)  # each run's database is new, migrated by the Rig
        set_triggers(self.db_url, on)
        await seed(self, n, **kw)

    def start_then(self: Rig, n: int) -> list[str]:
        seen["before"] = cpu_s(postmaster, children=True)
        return start(self, n)

    async def events_then(self: Rig) -> Any:
        seen["after"] = cpu_s(postmaster, children=True)
        return await events(self)

    patched: dict[str, Callable[..., Any]] = {
        "seed": seed_then,
        "start_replicas": start_then,
        "events_state": events_then,
    }
    for name, f in patched.items():
        setattr(Rig, name, f)
    try:
        ctx = Context(url, nats_url, workdir, 3, scale, lambda _: None)
        metrics = asyncio.run(scenarios.drain(ctx))
    finally:
        Rig.seed, Rig.start_replicas, Rig.events_state = seed, start, events  # type: ignore[method-assign]
    return (seen["after"] - seen["before"]) / float(metrics["timers"]) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m tools.bench.quota_triggers", description=__doc__.split("\n")[0]
    )
    p.add_argument("mode", choices=["claim", "drain"])
    p.add_argument("--timers", type=int, default=50_000, help="claim: overdue one-shot timers per round")
    p.add_argument("--tenants", type=int, default=1000, help="claim: tenants they spread over")
    p.add_argument("--scale", type=float, default=0.1, help="drain: the scenario's scale")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--old", type=Path, help="a version of 0014 to put in place of this one")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="quota-ab-") as tmp, servers(Path(tmp)) as (url, nats_url):
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            postmaster = int(Path(f"/proc/{row[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
        calibration = [describe(calibrate(Path(tmp)))]
        old = args.old.read_text() if args.old else None
        if args.mode == "claim":
            migrate(url)
            replace_0014(url, old)
        ms: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(args.rounds):
            for variant in ("off", "on") if r % 2 == 0 else ("on", "off"):
                if args.mode == "claim":
                    ms[variant].append(claim_round(url, args.timers, args.tenants, variant == "on"))
                else:
                    ms[variant].append(
                        drain_round(url, nats_url, Path(tmp), args.scale, postmaster, variant == "on", old)
                    )
        calibration.append(describe(calibrate(Path(tmp))))
    on, off = statistics.median(ms["on"]), statistics.median(ms["off"])
    print(
        json.dumps(
            {
                "calibration": calibration,
                "cpu_ms_per_1k_fires": ms,
                "on": on,
                "off": off,
                "on_over_off": on / off,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
