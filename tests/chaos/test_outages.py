"""Fault injection, the servers' outages: Postgres stopped hard, NATS killed, a NATS cluster's
stream leaders killed, each while the workload runs (tests/chaos/scenario.py), then every timer
checked. A file of its own so that the scenarios run beside the others (`make test`, xdist)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.chaos.cluster import NatsCluster
from tests.chaos.scenario import Chaos, MakeRun, passes
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres

pytestmark = pytest.mark.chaos


async def outages(c: Chaos, every_s: float, down: Callable[[], None], up: Callable[[], None]) -> None:
    """Take a server down every `every_s` seconds for 2 s while the workload runs; up at the end.
    `up` runs in this thread: an embedded server lives as long as the thread that started it."""
    try:
        while await c.pause(every_s):
            with c.outage():
                down()
                c.faults += 1
                await asyncio.sleep(2)  # the outage
                up()
    finally:
        up()


async def test_postgres_stopped_hard_and_restarted(make_run: MakeRun, chaos_pg: EmbeddedPostgres) -> None:
    run = make_run("postgres-down", replicas=3)
    await passes(run, lambda c: outages(c, 4, lambda: chaos_pg.stop("immediate"), chaos_pg.start))


async def test_nats_killed_and_restarted(make_run: MakeRun, chaos_nats: EmbeddedNats) -> None:
    run = make_run("nats-down", replicas=3)
    await passes(run, lambda c: outages(c, 5, chaos_nats.kill, chaos_nats.start))


async def test_nats_cluster_loses_its_stream_leaders(make_run: MakeRun, tmp_path: Path) -> None:
    """R3 streams on a 3-node cluster, as production runs NATS: the events stream's leader is
    killed mid-run, then the commands stream's, each restarted once another node leads."""
    with NatsCluster(tmp_path / "cluster") as cluster:
        run = make_run("nats-cluster", nats=cluster.url, replicas=3, stream_replicas=3)
        streams = [run.replica_env["TIMER_EVENT_STREAM"], run.replica_env["TIMER_COMMAND_STREAM"]]

        async def faults(c: Chaos) -> None:
            down: int | None = None
            try:
                for stream in streams:
                    # An election takes 4-7 s: both kills land while the workload is running.
                    if not await c.pause(run.workload.span_s / 7):
                        break
                    down = await asyncio.to_thread(cluster.stream_leader, stream)
                    with c.outage():  # the stream has no leader until the election
                        cluster.kill(down)
                        c.faults += 1
                        await asyncio.to_thread(cluster.wait_stream_leader_elected, stream, down)
                    cluster.restart(down)  # from this thread: the node lives as long as it
                    down = None
            finally:
                if down is not None:
                    cluster.restart(down)

        await passes(run, faults)
