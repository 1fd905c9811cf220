"""`timer-service consumer add` (worker/ops/consumers.py): a tenant's pull consumers, and the push
consumer an earlier release provisioned refused with what to do."""

from __future__ import annotations

import asyncio

from nats.js import api

from tests.helpers import settings_env
from tests.integration.ops.test_cli import run
from worker.adapters.jetstream.broker import Broker
from worker.config import Settings


async def test_consumer_add_makes_pull_consumers_and_refuses_an_earlier_push_one_saying_what_to_do(
    streams: Broker, settings: Settings
) -> None:
    env, stream, p = settings_env(settings), settings.event_stream, settings.subject_prefix
    earlier = api.ConsumerConfig(
        durable_name="acme",
        deliver_subject=f"_INBOX_acme.{stream}",
        filter_subject=f"{p}.acme.timer.due",
        ack_policy=api.AckPolicy.EXPLICIT,
        flow_control=True,
        idle_heartbeat=5.0,
    )
    await streams.js.add_consumer(stream, earlier)
    refused = await asyncio.to_thread(run, "consumer", "add", "--tenant", "acme", **env)
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr.splitlines() == [
        f"timer-service: consumer acme on {stream} is a push consumer (provisioned by an earlier "
        f"release); once no reader is on it, delete it (`nats consumer rm {stream} acme`) and run this again"
    ]
    await streams.js.delete_consumer(stream, "acme")  # as the line says
    added = await asyncio.to_thread(run, "consumer", "add", "--tenant", "acme", **env)
    assert (added.returncode, added.stderr) == (0, ""), added.stderr
    assert added.stdout.splitlines()[0] == f"consumer acme on {stream}: {p}.acme.timer.due, pull"
    info = await streams.js.consumer_info(stream, "acme")
    assert info.config.deliver_subject is None and info.config.ack_policy == api.AckPolicy.EXPLICIT
    again = await asyncio.to_thread(run, "consumer", "add", "--tenant", "acme", **env)
    assert (again.returncode, again.stdout) == (0, added.stdout), "run again: no change"
