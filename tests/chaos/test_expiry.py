"""Expiry across a crash (docs/CONTRACT.md, Expiry): a replica that dies after the PubAck of an
occurrence's DueTimeReached and before its commit leaves the occurrence to the next claim, which
comes after its expireAfter has passed. That occurrence was delivered: it must fire again under the
same id (dropped as a duplicate), never become an ExpiredOccurrence too. One one-shot and one
recurring timer, both with expireAfter PT1S; the crash point fires at probability 1, so the run
is the same every time, and takes seconds."""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import nats.js.errors
import pytest

from tests.helpers import query, row, until
from tests.servers import delete_streams, own_names
from worker.core.crashpoints import CRASH_EXIT
from worker.devkit.embedded import EmbeddedNats
from worker.devkit.harness import ReplicaSet, replica_env_from

pytestmark = pytest.mark.chaos

TIMERS: dict[str, dict[str, Any]] = {
    "once": {"expireAfter": "PT1S"},
    "hourly": {"expireAfter": "PT1S", "repeat": {"every": "PT1H"}},
}


def _db_now(db_url: str) -> datetime:
    ((now,),) = query(db_url, "SELECT now()")
    return now  # type: ignore[no-any-return]


async def _messages(js: Any, stream: str) -> list[dict[str, Any]]:
    """Every message `stream` holds, as JSON bodies (the stream's own count, not a subscriber's)."""
    info = await js.stream_info(stream)
    return [json.loads((await js.get_msg(stream, seq)).data) for seq in range(1, info.state.last_seq + 1)]


async def test_an_occurrence_published_before_a_crash_fires_and_never_expires(
    chaos_db: str, chaos_nats: EmbeddedNats, tmp_path: Path
) -> None:
    tag = f"c{uuid.uuid4().hex[:8]}"
    names = own_names(tag)
    env = {**replica_env_from(chaos_db, chaos_nats.url, **names), "TIMER_LOG_FORMAT": "json"}
    events, dlq = str(names["event_stream"]), str(names["dlq_stream"])
    nc = await nats.connect(chaos_nats.url)
    js = nc.jetstream()

    async def streams_ready() -> bool:
        try:
            await js.consumer_info(str(names["command_stream"]), str(names["consumer"]))
        except (nats.js.errors.NotFoundError, nats.errors.TimeoutError):
            return False
        return True

    try:
        with ReplicaSet(env, tmp_path) as fleet:
            (doomed,) = fleet.start(1, {"TIMER_TEST_CRASH": "published:1"})
            await until(streams_ready, timeout=60, what="the first replica's streams")
            due = _db_now(chaos_db) + timedelta(seconds=1)
            for key, extra in TIMERS.items():
                body = {"tenantId": "acme", "serviceCallId": key, "dueAt": due.isoformat(), **extra}
                await js.publish(f"{tag}.acme.timer.schedule", json.dumps(body).encode())
            proc = fleet.procs[doomed]
            code = await until(lambda: proc.poll(), timeout=30, what="the crash after the PubAck")
            assert code == CRASH_EXIT
            published = await _messages(js, events)
            assert sorted(e["payload"]["serviceCallId"] for e in published) == sorted(TIMERS)
            # The claim rolled back; the next one comes only once expireAfter has passed.
            await until(
                lambda: _db_now(chaos_db) > due + timedelta(seconds=1.5), timeout=10, what="expiry passed"
            )
            fleet.start(1)

            def recorded() -> bool:
                once, hourly = row(chaos_db, "acme", "once"), row(chaos_db, "acme", "hourly")
                assert once is not None and hourly is not None
                return once["state"] != "Scheduled" and hourly["occurrence_index"] > 0

            await until(recorded, timeout=60, what="both occurrences recorded by the next replica")
            once, hourly = row(chaos_db, "acme", "once"), row(chaos_db, "acme", "hourly")
            assert once is not None and hourly is not None
            assert (once["state"], once["fired_count"]) == ("Reached", 1)
            assert (hourly["state"], hourly["fired_count"]) == ("Scheduled", 1)
            # Each entry is PubAcked before its row is recorded: the streams hold all there is.
            expired = {e["id"] for e in await _messages(js, dlq) if e.get("type") == "ExpiredOccurrence"}
            assert expired.isdisjoint(e["id"] for e in published), "a delivered occurrence also expired"
            assert len(await _messages(js, events)) == len(TIMERS), "the re-publish was not dropped"
    finally:
        await nc.close()
        await delete_streams(chaos_nats.url, tag)
