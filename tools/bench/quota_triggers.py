"""What the quota's triggers (migration 0014) cost the firing path: the same work with them enabled
and disabled, in turns whose order alternates round by round, on the embedded servers.

  * claim: claim_due alone on one connection until the seeded overdue timers are all claimed:
    the backend's CPU per 1,000 fires.
  * drain: the `drain` scenario: the Postgres server's CPU per 1,000 fires, from the replicas'
    start to the last event. `--old FILE` puts another version of 0014 in place of this one first.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path
from typing import Any

import psycopg

from tools.bench import scenarios
from tools.bench.report import calibrate, describe, parser, servers
from tools.bench.rig import BACKEND_PID_SQL, Context, Rig, StreamState, admin, tree_cpu_s
from worker.adapters.postgres.claim import claim_due_params
from worker.adapters.postgres.migrations import migrate
from worker.adapters.postgres.queries import QUERIES
from worker.core.domain import ClaimParams

SEED = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)
SELECT 't' || (i %% %(tenants)s), 'k-' || md5(i::text), 'Scheduled', d, d
FROM generate_series(0, %(n)s - 1) AS i,
     LATERAL (SELECT now() - interval '1 hour' + i * interval '1 millisecond') AS x(d)
"""
# the claim a replica sends (claim_due_params: it follows the statement's parameters)
CLAIM = claim_due_params(
    ClaimParams("ab", 1000, 100, lease_ms=30_000, ahead_ms=0, fresh_window_ms=2000, downtime_ms=60_000)
)


def prepare(url: str, on: bool, old: str | None) -> None:
    """Another version of 0014 in place of this one (None: this one), its triggers on or off."""
    if old:
        admin(
            url,
            "DROP TABLE tenant_pending CASCADE",
            "DROP FUNCTION timers_count_inserted, timers_count_revived CASCADE",
        )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(old.encode())
    admin(url, f"ALTER TABLE timers {'ENABLE' if on else 'DISABLE'} TRIGGER USER")


def claim_round(url: str, n: int, tenants: int, on: bool) -> float:
    """Backend CPU ms per 1,000 one-shot fires claimed."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE timers, tenant_pending")
        prepare(url, on, None)
        conn.execute(SEED, {"n": n, "tenants": tenants})
        conn.execute("VACUUM ANALYZE timers")
        row = conn.execute(BACKEND_PID_SQL).fetchone()
        assert row is not None
        before, fired = tree_cpu_s([row[0]]), 0
        while True:
            with conn.transaction():
                got = len(conn.execute(QUERIES["claim_due"], CLAIM).fetchall())
            if got <= 1:  # the one row of a claim that took nothing
                return (tree_cpu_s([row[0]]) - before) / fired * 1e6
            fired += got


class _Metered(Rig):
    """The drain's rig, 0014 as asked, and the server's CPU read as the replicas start and end."""

    on: bool
    old: str | None
    postmaster: int
    seen: dict[str, float]

    async def seed(self, n: int, **kw: Any) -> None:
        prepare(self.db_url, self.on, self.old)
        await super().seed(n, **kw)

    def start_replicas(self, n: int) -> list[str]:
        self.seen["before"] = tree_cpu_s([self.postmaster])
        return super().start_replicas(n)

    async def events_state(self) -> StreamState:
        self.seen["after"] = tree_cpu_s([self.postmaster])
        return await super().events_state()


def drain_round(url: str, nats_url: str, workdir: Path, scale: float, on: bool, old: str | None) -> float:
    """Postgres CPU ms per 1,000 fires of the drain scenario."""
    with psycopg.connect(url) as conn:  # the postmaster: the parent of this connection's backend
        row = conn.execute(BACKEND_PID_SQL).fetchone()
        assert row is not None
        postmaster = int(Path(f"/proc/{row[0]}/stat").read_text().rsplit(")", 1)[1].split()[1])
    seen: dict[str, float] = {}
    metered: type[_Metered] = type(
        "Metered", (_Metered,), {"on": on, "old": old, "postmaster": postmaster, "seen": seen}
    )

    class Metering(Context):
        def rig(self, **settings: Any) -> Rig:
            return metered(self.admin_url, self.nats_url, self.workdir, **settings)

    metrics = asyncio.run(scenarios.drain(Metering(url, nats_url, workdir, 3, scale, lambda _: None)))
    return (seen["after"] - seen["before"]) / float(metrics["timers"]) * 1e6


def main() -> None:
    p = parser("python -m tools.bench.quota_triggers", __doc__)
    p.add_argument("mode", choices=["claim", "drain"])
    p.add_argument("--timers", type=int, default=50_000, help="claim: overdue one-shot timers per round")
    p.add_argument("--tenants", type=int, default=1000, help="claim: tenants they spread over")
    p.add_argument("--scale", type=float, default=0.1, help="drain: the scenario's scale")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--old", type=Path, help="a version of 0014 to put in place of this one")
    args = p.parse_args()
    old = args.old.read_text() if args.old else None
    with servers("quota-ab") as (url, nats_url, tmp):
        calibration = [describe(calibrate(tmp))]
        if args.mode == "claim":
            migrate(url)
            prepare(url, True, old)
        ms: dict[str, list[float]] = {"on": [], "off": []}
        for r in range(args.rounds):
            for variant in ("off", "on") if r % 2 == 0 else ("on", "off"):
                if args.mode == "claim":
                    ms[variant].append(claim_round(url, args.timers, args.tenants, variant == "on"))
                else:
                    ms[variant].append(drain_round(url, nats_url, tmp, args.scale, variant == "on", old))
        calibration.append(describe(calibrate(tmp)))
    on, off = statistics.median(ms["on"]), statistics.median(ms["off"])
    report = {
        "calibration": calibration,
        "cpu_ms_per_1k_fires": ms,
        "on": on,
        "off": off,
        "on_over_off": on / off,
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
