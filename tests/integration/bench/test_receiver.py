"""tools/bench/receiver.py: the soak's consumer in its own process, read back by the bench."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import nats
import pytest

from tools.bench.consumer import event
from tools.bench.receiver import Receiver
from tools.bench.rig import Rig
from worker.contract import Subjects
from worker.devkit.polling import until_async

DUE_AT = datetime(2026, 11, 24, 12, 0, 0, 123456, UTC).timestamp()  # tools.bench.consumer.event's dueAt
STALL_S = 3.0  # the bench's process held up: far longer than a delivery takes on a busy machine


async def _publish(nats_url: str, prefix: str) -> None:
    """20 events as a replica publishes them into the run's event stream, each acknowledged."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for i in range(20):
        _, body, _, headers = event(i)
        await js.publish(Subjects(prefix).due(f"t{i % 10}"), body, headers=headers)
    await nc.close()


async def test_the_consumer_receives_while_the_bench_is_stalled_and_each_receipt_is_read_once(
    pg_server_url: str, nats_url: str, tmp_path: Path
) -> None:
    receiver = Receiver(tmp_path / "receipts.jsonl")
    async with Rig(pg_server_url, nats_url, tmp_path) as rig, receiver:
        prefix = rig.names["subject_prefix"]
        await receiver.start(nats_url, prefix, rig.names["event_stream"], "bench-receiver")
        sent = time.time()
        # The bench's event loop stalls (as a pass over its records or a full collection would)
        # while the events are published, as a replica would, from elsewhere: a consumer in this
        # process could take none of their receive times before the stall ended.
        publishing = threading.Thread(target=asyncio.run, args=(_publish(nats_url, prefix),))
        publishing.start()
        publishing.join()  # the stall under test begins: the events are stored when it returns
        time.sleep(STALL_S)  # noqa: ASYNC251  # the stall goes on after
        stalled_until = time.time()
        got: list[tuple[str, float, float]] = []

        def all_in() -> bool:
            got.extend(receiver.take())
            return len(got) >= 20

        await until_async(all_in, timeout=30, what="20 receipts")
        assert sorted(k for k, _, _ in got) == sorted(f"d-{i}" for i in range(20))  # each once
        assert all(due == pytest.approx(DUE_AT, abs=1e-6) for _, due, _ in got)
        assert all(sent <= received < stalled_until for _, _, received in got), (sent, stalled_until, got)
        assert receiver.exited is None
    assert receiver.exited is not None  # the block ended the consumer's process
