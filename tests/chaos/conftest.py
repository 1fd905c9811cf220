"""Servers of the chaos suite's own: these scenarios kill and restart Postgres and NATS, which a
test can only do to servers it started. So they always run on embedded servers (the last resort
of tests/conftest.py's order, and what runs on the team's machines and in CI anyway), never
skipped."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.scenario import RESULTS, Run, scale
from tests.chaos.workload import Workload
from tests.servers import create_template, delete_streams, fresh_database, own_names
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres
from worker.devkit.harness import replica_env_from

# Per scenario in `make test`: 2,000 timers sent over 15 s (due 6-12 s after each is sent).
# TIMER_CHAOS_SCALE=10 (make chaos-soak) makes it 20,000 over 150 s, per scenario.
TIMERS = 2000
SPAN_S = 15.0


@pytest.fixture(scope="session")
def chaos_pg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres(tmp_path_factory.mktemp("chaos-pg")) as pg:
        create_template(pg.url)
        yield pg


@pytest.fixture(scope="session")
def chaos_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    with EmbeddedNats(tmp_path_factory.mktemp("chaos-nats")) as server:
        yield server


@pytest.fixture
def chaos_db(chaos_pg: EmbeddedPostgres) -> Iterator[str]:
    with fresh_database(chaos_pg.url) as url:
        yield url


@pytest.fixture
async def make_run(chaos_db: str, chaos_nats: EmbeddedNats, tmp_path: Path) -> Any:
    """make_run(name, db=..., replica_db=..., replica_nats=..., nats=..., timers=..., span_s=...,
    **settings): a Run on this test's database (or `db`), with a subject prefix and streams of its
    own; `timers` sent over `span_s` (each times TIMER_CHAOS_SCALE)."""
    tag = f"c{uuid.uuid4().hex[:8]}"
    used: list[str] = []

    def make(
        name: str,
        *,
        db: str | None = None,
        replica_db: str | None = None,
        replica_nats: str | None = None,
        nats: str | None = None,
        replicas: int = 4,
        variants: list[dict[str, str]] | None = None,
        timers: int = TIMERS,
        span_s: float = SPAN_S,
        **settings: Any,
    ) -> Run:
        direct_nats = nats or chaos_nats.url
        used.append(direct_nats)
        names = own_names(tag)
        env = replica_env_from(replica_db or db or chaos_db, replica_nats or direct_nats, **names, **settings)
        workload = Workload(int(timers * scale()), span_s * scale())
        return Run(name, db or chaos_db, direct_nats, env, tmp_path, workload, replicas, variants or [])

    maker: Callable[..., Run] = make
    yield maker
    if chaos_nats.running and chaos_nats.url in used:
        await delete_streams(chaos_nats.url, tag)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if RESULTS:
        terminalreporter.section("chaos scenarios")
        for line in RESULTS:
            terminalreporter.write_line(line)
