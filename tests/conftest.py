"""Real Postgres and NATS JetStream for the tests.

The servers are found in this order: TIMER_TEST_DATABASE_URL / TIMER_TEST_NATS_URL when set;
testcontainers when a Docker engine answers; otherwise throwaway embedded servers
(`worker.devkit.embedded`), which is what runs on the team's machines and in CI. Never skipped.

Servers live for the session; isolation is per test: a database cloned from a migrated template
(`CREATE DATABASE ... TEMPLATE`) and a subject prefix, streams and consumer of its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.servers import (
    Servers,
    create_template,
    delete_streams,
    find_servers,
    fresh_database,
    own_names,
)
from worker import tracing
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres
from worker.settings import load_settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    with find_servers(tmp_path_factory.mktemp("servers")) as found:
        yield found


@pytest.fixture(scope="session")
def pg_server_url(servers: Servers) -> str:
    """The Postgres server's URL (its `postgres` database)."""
    return servers.pg_url


@pytest.fixture(scope="session")
def nats_url(servers: Servers) -> str:
    return servers.nats_url


@pytest.fixture(scope="session")
def embedded_pg(servers: Servers) -> EmbeddedPostgres | None:
    """The session's embedded Postgres, for tests that kill and restart it; None on other servers."""
    return servers.pg


@pytest.fixture(scope="session")
def embedded_nats(servers: Servers) -> EmbeddedNats | None:
    """The session's embedded NATS, for tests that kill and restart it; None on other servers."""
    return servers.nats


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> str:
    """URL of the template database: every migration applied; `db_url` clones it."""
    return create_template(pg_server_url)


@pytest.fixture
def db_url(servers: Servers, template_db: str) -> Iterator[str]:
    """A migrated database of this test's own; dropped afterwards."""
    servers.revive()
    with fresh_database(servers.pg_url) as url:
        yield url
        servers.revive()


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    """A Store on this test's database, for tests of single statements."""
    # The replica's, session pins and all; a claim left open a minute is rolled back, as a replica's.
    pool = db.pool(db_url, "tests", min_size=1, max_size=2, idle_in_transaction_ms=60_000)
    await pool.open()
    yield Store(pool)
    await pool.close()


@pytest.fixture
async def settings(servers: Servers, db_url: str) -> AsyncIterator[Settings]:
    """Settings on this test's database, with a subject prefix, streams and consumer of its own."""
    tag = f"t{uuid.uuid4().hex[:8]}"
    yield load_settings(database_url=db_url, nats_url=servers.nats_url, log_format="text", **own_names(tag))
    servers.revive()
    await delete_streams(servers.nats_url, tag)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Tracing on for this test, into an in-memory exporter (as OTEL_EXPORTER_OTLP_ENDPOINT would
    turn it on, to a collector); off again afterwards."""
    exporter = InMemorySpanExporter()
    tracing.enable(SimpleSpanProcessor(exporter))
    try:
        yield exporter
    finally:
        tracing.disable()


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sdist and wheel, the wheel built from the sdist (python -m build), as a release makes them:
    built once a session for tests/deploy/test_deploy_release.py (what they hold) and
    tests/integration/test_installed.py (the wheel installed), outside the tree, which is left as it
    was. The build's output is kept in build.log for test_the_build_warns_of_nothing."""
    out = tmp_path_factory.mktemp("dist")
    # From a copy without build leftovers: setuptools adds the files a stale *.egg-info/SOURCES.txt
    # lists to the sdist, so a file MANIFEST.in leaves out could ship from this tree and no other.
    tree = tmp_path_factory.mktemp("tree") / "src"
    shutil.copytree(
        ROOT, tree, ignore=shutil.ignore_patterns(".*", "*.egg-info", "build", "dist", "__pycache__")
    )
    # PYTHONDONTWRITEBYTECODE makes distutils warn that it skips byte-compiling: the machine's
    # setting, not the project's, so the build runs without it.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    argv = [sys.executable, "-m", "build", "--outdir", str(out), str(tree)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert result.returncode == 0, f"python -m build failed:\n{result.stdout}\n{result.stderr}"
    (out / "build.log").write_text(result.stdout + result.stderr)
    return out
