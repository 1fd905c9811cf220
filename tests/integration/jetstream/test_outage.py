"""A replica through a NATS outage long enough to fill nats-py's outbound buffer."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    consumer_idle,
    iso_in,
    jetstream,
    publish_raw,
    query,
    recorder,
    row,
    running_replica,
    until,
)
from worker.config import Settings
from worker.devkit.embedded import EmbeddedNats


@pytest.mark.timeout(120)
async def test_firing_resumes_with_every_permit_free_after_an_outage_filled_the_buffer(
    settings: Settings, db_url: str, embedded_nats: EmbeddedNats | None, caplog: pytest.LogCaptureFixture
) -> None:
    # A small buffer (a few dozen events) and few permits: a lost permit shows at once.
    assert embedded_nats is not None, "stops and restarts NATS: needs the embedded server"
    n, permits = 300, 20
    keys = [("acme", f"o-{i}") for i in range(n)]

    def buffer_full() -> bool:
        return any("OutboundBufferLimitError" in str(getattr(r, "error", "")) for r in caplog.records)

    caplog.set_level(logging.WARNING, logger="worker")
    async with (
        running_replica(settings, max_in_flight=permits, publish_buffer_bytes=16_384) as replica,
        recorder(settings) as rec,
    ):
        embedded_nats.stop()
        # Stored as intake leaves them, already due, once NATS is down: they come due in the
        # outage however slowly the machine stores them.
        query(
            db_url,
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
            " SELECT 'acme', 'o-' || i, 'Scheduled', now(), now() FROM generate_series(0, %s) i",
            n - 1,
        )
        # First attempts in an atomic batch, then retries one by one.
        await until(buffer_full, timeout=30, what="a publish refused by the full outbound buffer")
        await until(
            lambda: sum(1 for r in caplog.records if getattr(r, "action", "") == "publish_failed") >= 3,
            what="retries in the outage",
        )
        embedded_nats.start()
        await until(lambda: len(rec.keys()) >= n, timeout=60, what="every timer fired once NATS is back")
        await until(lambda: replica.broker.permits._value == permits, what="every permit free")
    assert rec.keys() == Counter(dict.fromkeys(keys, 1))


@pytest.mark.timeout(120)
async def test_an_acknowledgement_that_cannot_be_buffered_in_an_outage_does_not_end_intake(
    settings: Settings, db_url: str, embedded_nats: EmbeddedNats | None
) -> None:
    """TIMER_PUBLISH_BUFFER_BYTES=0 and NATS down as a committed command is acknowledged: the ack
    raises (OutboundBufferLimitError). The command is stored; it comes back after the ack wait
    and is acknowledged then. Intake goes on."""
    assert embedded_nats is not None, "stops and restarts NATS: needs the embedded server"
    query(
        db_url, "INSERT INTO timers (tenant_id, service_call_id, state) VALUES ('acme', 'held', 'Cancelled')"
    )
    async with running_replica(settings, publish_buffer_bytes=0) as replica, jetstream(settings) as js:
        with psycopg.connect(db_url) as lock:  # holds the row: intake's commit waits behind it
            lock.execute("SELECT 1 FROM timers WHERE service_call_id = 'held' FOR UPDATE")
            body = {"tenantId": "acme", "serviceCallId": "held", "dueAt": iso_in(3600, db_url)}
            await publish_raw(js, settings, "acme", "schedule", body)
            await until(
                lambda: (
                    query(db_url, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")[0][
                        0
                    ]
                    == 1
                ),
                what="intake's write waiting on the row",
            )
            embedded_nats.stop()
            await until(lambda: not replica.broker.connected, what="the replica sees NATS gone")
        # The lock is gone: intake commits, then acknowledges into a connection with no buffer.
        await until(lambda: row(db_url, "acme", "held")["state"] == "Scheduled", what="command stored")  # type: ignore[index]
        embedded_nats.start()
        await until(lambda: replica.broker.connected, timeout=30, what="NATS back")
        await until(lambda: consumer_idle(settings), timeout=60, what="the command acknowledged after all")
        assert not replica.stop.is_set(), "intake died on an acknowledgement it could not send"


async def test_a_batch_split_by_a_reconnect_does_not_turn_atomic_publishing_off(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reconnect in the middle of an atomic batch loses part of it: the server refuses the
    commit (the batch is incomplete). That says nothing about the stream; the batch goes one by
    one and the next one is atomic again. Only a stream without allow_atomic turns batching off."""
    from worker.adapters.jetstream import publisher
    from worker.adapters.jetstream.broker import Broker
    from worker.client.wire import Message
    from worker.contract import Outgoing

    broker = Broker(settings)
    await broker.connect()
    try:
        await broker.ensure_streams()
        assert broker.nc is not None
        send_all = publisher.publish_all  # a batch but its commit goes out in one write
        lost = []

        async def lose_the_second(nc: Any, messages: list[Message]) -> None:
            kept = [m for m in messages if (m[3] or {}).get("Nats-Batch-Sequence") != "2" or lost]
            if len(kept) < len(messages):
                lost.append(messages[1][0])  # as if the connection dropped it
            await send_all(nc, kept)

        monkeypatch.setattr(publisher, "publish_all", lose_the_second)
        due = settings.subject_prefix + ".acme.timer.due"

        def batch(tag: str) -> list[Outgoing]:
            return [Outgoing(due, b"{}", {"Nats-Msg-Id": f"{tag}-{i}"}) for i in range(150)]

        assert await broker.publish_atomic(batch("split"), 10) == [None] * 150  # one by one
        assert lost, "the batch was not split"
        assert broker.publisher.atomic, "an incomplete batch turned atomic publishing off for good"
    finally:
        await broker.close()
