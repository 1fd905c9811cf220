"""What `status` says about the fleet taking commands (worker/ops/fleet.py), on replicas as real
processes: busy ones keep no pull request waiting, and must count all the same."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import nats

from tests.helpers import query, settings_env, until
from tests.integration.ops.test_cli import run
from worker.config import Settings
from worker.devkit.harness import ReplicaSet

REPLICAS = 3
# Intake one command at a time: three replicas then apply a few thousand a second at most, which
# one producer outruns, so the stream always holds commands while `status` looks.
BATCH = "1"


async def _produce(settings: Settings, stop: asyncio.Event) -> int:
    """ScheduleTimers, pipelined, as fast as the server acknowledges them, until stop."""
    nc = await nats.connect(settings.nats_url)
    js = nc.jetstream()
    sent = 0
    try:
        while not stop.is_set():
            futures = []
            for _ in range(200):
                sent += 1
                body = json.dumps(
                    {"tenantId": "acme", "serviceCallId": f"t{sent}", "dueAt": "2099-01-01T00:00:00Z"}
                )
                futures.append(
                    await js.publish_async(f"{settings.subject_prefix}.acme.timer.schedule", body.encode())
                )
            await asyncio.gather(*futures)
    finally:
        await nc.close()
    return sent


async def _consumer_pending(settings: Settings) -> int:
    nc = await nats.connect(settings.nats_url)
    try:
        info = await nc.jetstream().consumer_info(settings.command_stream, settings.consumer)
        return int(info.num_pending or 0)
    finally:
        await nc.close()


async def test_status_counts_every_replica_of_a_busy_fleet_as_taking_commands(
    settings: Settings, tmp_path: Path
) -> None:
    env = settings_env(settings)
    with ReplicaSet(env | {"TIMER_INTAKE_BATCH_SIZE": BATCH}, tmp_path) as fleet:
        fleet.start(REPLICAS)
        await until(
            lambda: (
                query(
                    settings.database_url.get_secret_value(),
                    "SELECT count(DISTINCT worker_id) FROM timer_stats",
                )[0][0]
                == REPLICAS
            ),
            timeout=60,
            what="every replica's first stats",
        )
        stop = asyncio.Event()
        producer = asyncio.create_task(_produce(settings, stop))
        try:

            async def backlogged() -> bool:
                return await _consumer_pending(settings) > 500

            await until(backlogged, timeout=60, what="a backlog the fleet works through")
            shown = await asyncio.to_thread(run, "status", "--json", **env)
            text = await asyncio.to_thread(run, "status", **env)
        finally:
            stop.set()
            await producer
        assert fleet.alive() == [f"replica-{i}" for i in range(1, REPLICAS + 1)], (
            "a replica died: its log is in tmp_path"
        )
    commands = json.loads(shown.stdout)["commands"]
    assert commands["pending"] > 0, commands  # the fleet was busy when status looked
    assert f"{REPLICAS} replica(s) taking commands" in text.stdout, text.stdout
    assert commands["taking"] == REPLICAS, commands
