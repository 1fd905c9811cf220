"""A rolling upgrade under load, as a Deployment does it: the replicas of the running release keep
working while the migrate Job applies the next release's migrations (tests/fixtures/next_release:
a column added under a lock_timeout, an index built CONCURRENTLY), then replicas of the new
release start beside them. No timer may be lost or fire twice, and the migration must not wait
behind the fleet nor hold it up."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

from tests.chaos.scenario import RESULTS, Chaos, MakeRun, passes
from worker.adapters.postgres import migrations

pytestmark = pytest.mark.chaos

ROOT = Path(__file__).parent.parent.parent
NEXT_RELEASE = ROOT / "tests" / "fixtures" / "next_release"
NEW_REPLICAS = 2


async def test_the_next_migration_applies_while_the_running_release_works(
    make_run: MakeRun, chaos_db: str, tmp_path: Path
) -> None:
    release = tmp_path / "next-release-migrations"
    release.mkdir()
    for path in [*(ROOT / "sql" / "migrations").glob("*.sql"), *NEXT_RELEASE.glob("*.sql")]:
        (release / path.name).write_text(path.read_text(encoding="utf-8"))
    run = make_run("rolling-upgrade", replicas=3)
    applied: list[int] = []
    took: list[float] = []

    async def rollout(c: Chaos) -> None:
        if not await c.pause(run.workload.span_s / 3):  # the old release is firing and storing
            return
        started = time.monotonic()
        applied.extend(await asyncio.to_thread(migrations.migrate, chaos_db, release))  # the Job
        took.append(time.monotonic() - started)
        c.faults += 1
        c.fleet.start(NEW_REPLICAS)  # the new release's pods, beside the old ones
        while await c.pause(1.0):
            pass

    await passes(run, rollout)
    RESULTS.append(f"rolling upgrade: migrations {applied} applied under load in {took[0]:.2f}s")
    assert applied == [98, 99], "the next release's migrations did not apply during the run"
    with psycopg.connect(chaos_db, autocommit=True) as conn:
        valid = conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'timers_tenant_due'::regclass"
        ).fetchone()
    assert valid == (True,)
