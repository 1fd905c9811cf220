"""NatsCluster itself: an R3 stream keeps every acknowledged message through the death of its
leader, a client follows the stream to the new leader, and the dead node comes back caught up."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js import api

from tests.chaos.cluster import NatsCluster

pytestmark = pytest.mark.chaos

T = TypeVar("T")

STREAM = "CLUSTER_CHECK"
SUBJECT = "cluster-check.m"
RETRY_S = 30.0
# What a JetStream request meets while its stream has no leader or the client has no server.
# NoStreamResponseError: a publish met no responders; the subject's interest is still moving
# to the new leader.
TRANSIENT = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.js.errors.NoStreamResponseError,
    nats.errors.ConnectionReconnectingError,
    nats.js.errors.ServiceUnavailableError,
)


class NotYet(Exception):
    pass


async def retrying(call: Callable[[], Awaitable[T]], deadline_s: float = RETRY_S) -> T:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return await call()
        except (*TRANSIENT, NotYet):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)  # a pause between tries, not a wait for anything


async def publish(js: nats.js.JetStreamContext, n: int) -> int:
    """Message n, retried until acknowledged; its stream sequence. A retry of a message stored
    before its ack was lost is deduplicated (same Nats-Msg-Id) and acked with the first sequence."""
    ack = await retrying(lambda: js.publish(SUBJECT, b"%d" % n, timeout=1, headers={"Nats-Msg-Id": f"m{n}"}))
    assert ack.stream == STREAM
    return int(ack.seq)


def check_stored(cluster: NatsCluster, i: int, count: int) -> None:
    """Raise NotYet while node i's own replica of the stream holds fewer than `count` messages."""
    url = f"{cluster.nodes[i].monitor_url}/jsz?accounts=true&streams=true"
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=2) as resp:
        jsz = json.load(resp)
    details = [d for a in jsz["account_details"] for d in a.get("stream_detail") or [] if d["name"] == STREAM]
    assert len(details) == 1
    stored = int(details[0]["state"]["messages"])
    assert stored <= count
    if stored < count:
        raise NotYet(f"{cluster.names[i]} holds {stored} of {count}")


async def test_an_r3_stream_keeps_every_message_when_its_leader_dies(tmp_path: Path) -> None:
    timings: dict[str, float] = {}
    began = time.monotonic()
    with NatsCluster(tmp_path / "cluster") as cluster:
        timings["start"] = time.monotonic() - began
        setup = await nats.connect(servers=cluster.url.split(","))
        try:
            config = api.StreamConfig(name=STREAM, subjects=[SUBJECT], num_replicas=3)
            await setup.jetstream().add_stream(config)
        finally:
            await setup.close()
        leader = await asyncio.to_thread(cluster.stream_leader, STREAM)

        # Attached to the leader, so that killing it also cuts the client off.
        servers = [cluster.nodes[leader].url] + [n.url for j, n in enumerate(cluster.nodes) if j != leader]
        nc = await nats.connect(
            servers=servers, dont_randomize=True, max_reconnect_attempts=-1, reconnect_time_wait=0.1
        )
        try:
            js = nc.jetstream()
            assert nc.connected_url is not None and nc.connected_url.port == cluster.nodes[leader].port
            seqs = [await publish(js, n) for n in range(100)]

            killed_at = time.monotonic()
            cluster.kill(leader)
            new_leader = await asyncio.to_thread(cluster.wait_stream_leader_elected, STREAM, leader)
            timings["election"] = time.monotonic() - killed_at
            assert new_leader != leader

            seqs += [await publish(js, n) for n in range(100, 200)]
            timings["kill to 100 more acked"] = time.monotonic() - killed_at
            assert seqs == list(range(1, 201))
            info = await retrying(lambda: js.stream_info(STREAM))
            assert info.state.messages == 200
            assert info.cluster is not None and info.cluster.leader == cluster.names[new_leader]
            assert nc.stats["reconnects"] >= 1
            assert nc.connected_url is not None and nc.connected_url.port != cluster.nodes[leader].port

            restarted_at = time.monotonic()
            cluster.restart(leader)
            timings["restart"] = time.monotonic() - restarted_at
            # restart() returns once the stream's leader counts the node current, which is when
            # it has stored every entry; applying them to its stream follows a moment later.
            await retrying(lambda: asyncio.to_thread(check_stored, cluster, leader, 200), deadline_s=5)
        finally:
            await nc.close()
        stopping = time.monotonic()
    timings["stop"] = time.monotonic() - stopping
    timings["total"] = time.monotonic() - began
    print("cluster timings:", ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
