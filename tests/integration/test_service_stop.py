"""The replica's stop (worker/service.py) as a real process: SIGTERM ends it within the drain
timeout plus the documented margin (docs/OPERATIONS.md, Rolling replicas) whatever its servers do,
here NATS or Postgres stopped answering without resetting a connection (SIGSTOP: a partition),
and nothing it held is lost: another replica fires it once the server is back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.helpers import recorder, settings_env, until
from tests.servers import create_template
from worker.client import TimerClient
from worker.config import Settings
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres
from worker.devkit.harness import ReplicaSet
from worker.devkit.process import ServerProcess
from worker.service import EXIT_MARGIN_S

DRAIN_TIMEOUT_MS = 1000
# What a process takes beyond the replica's own stop: the interpreter's exit, on a busy machine
# (1 s was exceeded by 40 ms with four test workers on two cores). What the test tells apart is a
# replica that exits in a few seconds from one a frozen server holds for its TCP timeouts (minutes).
PROCESS_EXIT_S = 2.0


@pytest.fixture(params=["nats", "postgres"])
def frozen(
    request: pytest.FixtureRequest, settings: Settings, tmp_path: Path
) -> Iterator[tuple[Settings, ServerProcess]]:
    """The settings on a server of this test's own, to freeze (the session's serve the other
    tests), and that server."""
    if request.param == "nats":
        with EmbeddedNats(tmp_path / "nats") as nats_server:
            yield settings.model_copy(update={"nats_url": nats_server.url}), nats_server
    else:
        with EmbeddedPostgres(tmp_path / "postgres") as pg:
            yield settings.model_copy(update={"database_url": create_template(pg.url)}), pg


async def test_sigterm_ends_a_replica_in_time_while_a_server_does_not_answer(
    frozen: tuple[Settings, ServerProcess], tmp_path: Path
) -> None:
    settings, server = frozen
    env = settings_env(settings) | {"TIMER_DRAIN_TIMEOUT_MS": str(DRAIN_TIMEOUT_MS)}
    keys = {("acme", f"t-{i}") for i in range(2000)}
    with ReplicaSet(env, tmp_path) as fleet:
        (first,) = fleet.start(1)
        await until(lambda: _started(fleet, first), timeout=60, what="the replica started")
        async with recorder(settings) as rec:
            async with await TimerClient.connect(settings.nats_url, settings.subject_prefix) as client:
                # Due from now over 4 s: the replica is firing them when the server stops answering.
                start = datetime.now(UTC)
                timers = [
                    {"tenantId": t, "serviceCallId": s, "dueAt": start + timedelta(seconds=4 * i / len(keys))}
                    for i, (t, s) in enumerate(sorted(keys))
                ]
                sent = await client.schedule_many(timers)
                assert {s.outcome for s in sent} == {"accepted"}
            await until(lambda: len(rec.keys()) >= 100, timeout=60, what="the replica firing")
            with _frozen(server):
                began = time.monotonic()
                fleet.signal(first, signal.SIGTERM)
                bound = DRAIN_TIMEOUT_MS / 1000 + EXIT_MARGIN_S + PROCESS_EXIT_S
                code = await asyncio.to_thread(fleet.procs[first].wait, bound + 30)
                took = time.monotonic() - began
            assert took <= bound, f"exited {took:.1f} s after SIGTERM, more than {bound} s"
            assert code == 0
            # What it claimed and did not record fires from another replica once its lease ends.
            fleet.start(1)
            await until(lambda: rec.keys().keys() >= keys, timeout=60, what="every timer fired")


@contextlib.contextmanager
def _frozen(server: ServerProcess) -> Iterator[None]:
    """The server's processes stopped (SIGSTOP: its connections stay open, nothing answers), and
    continued afterwards whatever happened."""
    assert server.pid is not None
    os.killpg(server.pid, signal.SIGSTOP)  # its process group: Postgres's backends too
    try:
        yield
    finally:
        os.killpg(server.pid, signal.SIGCONT)


def _started(fleet: ReplicaSet, name: str) -> bool:
    """The replica logged that it started: connected, streams made, loops starting."""
    return "replica_started" in (fleet.log_dir / f"{name}.log").read_text(errors="replace")


async def test_a_client_closes_in_time_while_nats_does_not_answer(settings: Settings, tmp_path: Path) -> None:
    """TimerClient.close (and so every CLI command's exit) within its timeout, NATS frozen."""
    with EmbeddedNats(tmp_path / "nats") as nats_server:
        client = await TimerClient.connect(nats_server.url, settings.subject_prefix)
        await client.nc.flush()
        with _frozen(nats_server):
            await client.nc.publish("anything", b"still to flush")
            began = time.monotonic()
            await client.close(timeout=1.0)
            took = time.monotonic() - began
        assert took <= 1.0 + PROCESS_EXIT_S, f"closed {took:.1f} s after it was asked to"
        assert client.nc.is_closed
