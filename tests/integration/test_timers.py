"""The timer contract end to end, on real Postgres and NATS JetStream, with an in-process replica."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import nats
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
from worker import logs
from worker.config import Settings


def schedule(tenant: str, sc: str, due: str, **extra: object) -> dict[str, object]:
    return {"tenantId": tenant, "serviceCallId": sc, "dueAt": due, **extra}


def envelope(kind: str, ts: int, payload: dict[str, object]) -> dict[str, object]:
    return {
        "id": f"{kind}-{ts}",
        "type": kind,
        "tenantId": payload["tenantId"],
        "timestampMs": ts,
        "payload": payload,
    }


async def test_same_command_three_times_makes_one_timer_that_fires_once(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        body = schedule("acme", "sc-1", iso_in(0.5, db_url))
        for _ in range(3):
            await publish_raw(js, settings, "acme", "schedule", body)
        await until(
            lambda: (
                row(db_url, "acme", "sc-1") is not None and row(db_url, "acme", "sc-1")["state"] == "Reached"
            )
        )
        # A later copy, after it fired, is acknowledged and ignored.
        await publish_raw(js, settings, "acme", "schedule", body)
        await until(lambda: consumer_idle(settings), what="command stream drained")
    assert query(db_url, "SELECT count(*) FROM timers") == [(1,)]
    assert rec.keys() == {("acme", "sc-1"): 1}


async def test_reschedule_moves_due_at(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        await publish_raw(js, settings, "acme", "schedule", schedule("acme", "sc-1", iso_in(3600, db_url)))
        await until(lambda: row(db_url, "acme", "sc-1") is not None)
        soon = iso_in(0.3, db_url)
        await publish_raw(js, settings, "acme", "schedule", schedule("acme", "sc-1", soon))
        await until(lambda: rec.keys()[("acme", "sc-1")] == 1, what="rescheduled timer fired")
    fired = rec.firings[0]
    assert abs(fired.due_at - _epoch(soon)) < 0.001


async def test_cancel_before_claim_prevents_firing(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        await publish_raw(js, settings, "acme", "schedule", schedule("acme", "gone", iso_in(2, db_url)))
        await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": "gone"})
        await publish_raw(js, settings, "acme", "schedule", schedule("acme", "marker", iso_in(2.5, db_url)))
        await until(lambda: rec.keys()[("acme", "marker")] == 1, what="marker fired")
    assert rec.keys()[("acme", "gone")] == 0
    assert row(db_url, "acme", "gone")["state"] == "Cancelled"  # type: ignore[index]


async def test_cancelled_timer_is_rearmed_by_a_new_schedule(settings: Settings, db_url: str) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        await publish_raw(js, settings, "acme", "schedule", schedule("acme", "sc", iso_in(3600, db_url)))
        await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": "sc"})
        await until(lambda: (row(db_url, "acme", "sc") or {}).get("state") == "Cancelled")
        await publish_raw(js, settings, "acme", "schedule", schedule("acme", "sc", iso_in(0.2, db_url)))
        await until(lambda: rec.keys()[("acme", "sc")] == 1, what="re-armed timer fired")


async def test_older_timestamp_never_overwrites_newer(settings: Settings, db_url: str) -> None:
    far, near = iso_in(3600, db_url), iso_in(0.3, db_url)
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        # Delivered out of order: the newer command (ts=200) first, then the older one (ts=100).
        await publish_raw(
            js, settings, "acme", "schedule", envelope("ScheduleTimer", 200, schedule("acme", "a", near))
        )
        await publish_raw(
            js, settings, "acme", "schedule", envelope("ScheduleTimer", 100, schedule("acme", "a", far))
        )
        # A cancel older than the schedule does not cancel it either.
        await publish_raw(
            js, settings, "acme", "schedule", envelope("ScheduleTimer", 300, schedule("acme", "b", near))
        )
        await publish_raw(
            js,
            settings,
            "acme",
            "cancel",
            envelope("CancelTimer", 250, {"tenantId": "acme", "serviceCallId": "b"}),
        )
        await until(
            lambda: rec.keys()[("acme", "a")] == 1 and rec.keys()[("acme", "b")] == 1, what="both fired"
        )
    assert abs(rec.firings[0].due_at - _epoch(near)) < 0.001


async def test_nothing_fires_before_its_due_at_on_the_database_clock(settings: Settings, db_url: str) -> None:
    n = 300
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        for i in range(n):
            await publish_raw(
                js, settings, "acme", "schedule", schedule("acme", f"t{i}", iso_in(0.2 + i / 200, db_url))
            )
        await until(lambda: len(rec.keys()) == n, what="all fired")
    early = query(db_url, "SELECT count(*) FROM timers WHERE reached_at < due_at")
    assert early == [(0,)]
    assert query(db_url, "SELECT count(*) FROM timers WHERE state = 'Reached'") == [(n,)]
    # reachedAt in each event is the database time of the claim: never before dueAt.
    assert all(f.received_at >= f.due_at for f in rec.firings)


async def test_bad_input_goes_to_the_dlq_and_valid_commands_still_fire(
    settings: Settings, db_url: str
) -> None:
    poison = [
        ("acme", b"{not json"),
        ("acme", b'{"tenantId": "acme", "serviceCallId": "x"}'),
        ("acme", json.dumps(schedule("other", "x", iso_in(1))).encode()),
        ("acme", json.dumps(schedule("acme", "x", "2026-11-22T09:00:00")).encode()),
        ("acme", b"\xff\xfe"),
    ]
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        dlq = await js.subscribe(f"{settings.subject_prefix}.*.timer.dlq", stream=settings.dlq_stream)
        for tenant, body in poison:
            await publish_raw(js, settings, tenant, "schedule", body)
        await publish_raw(js, settings, "acme", "schedule", schedule("acme", "good", iso_in(0.2, db_url)))
        await until(lambda: rec.keys()[("acme", "good")] == 1, what="valid command fired")
        rejected = [await dlq.next_msg(timeout=10) for _ in poison]
    assert [m.data for m in rejected] == [body for _, body in poison]  # unchanged copies
    assert all(m.headers and m.headers.get("Timer-Error") for m in rejected)
    assert {m.subject for m in rejected} == {f"{settings.subject_prefix}.acme.timer.dlq"}


async def test_get_returns_the_read_model_for_the_tenant_only(settings: Settings, db_url: str) -> None:
    from worker.client import TimerClient

    async with running_replica(settings), jetstream(settings) as js:
        await publish_raw(
            js,
            settings,
            "acme",
            "schedule",
            schedule("acme", "sc-9", iso_in(3600, db_url), correlationId="r-1"),
        )
        await until(lambda: row(db_url, "acme", "sc-9") is not None)
        client = TimerClient(
            await nats.connect(settings.nats_url), settings.subject_prefix, owns_connection=True
        )
        async with client:
            view = await client.get("acme", "sc-9")
            assert view is not None
            assert (view["state"], view["correlationId"]) == ("Scheduled", "r-1")
            assert await client.get("globex", "sc-9") is None
            assert await client.get("acme", "missing") is None


async def test_gets_while_postgres_is_away_log_one_line_not_one_each(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """With Postgres away, and at every replica's stop (its pool closes beside NATS's drain),
    each get waiting logged `get failed`: ~36,000 lines at the stop after a flood. Each is still
    answered `unavailable`; the line comes at most once every logs.THROTTLE_S, the next saying
    how many it left out."""
    caplog.set_level(logging.WARNING, logger="worker.core.readmodel")
    started = time.monotonic()
    async with running_replica(settings) as replica:
        await replica.pool.close()  # every lookup now fails, as at a stop
        nc = await nats.connect(settings.nats_url)
        try:
            body = b'{"serviceCallId": "sc-1"}'
            gets = [
                nc.request(f"{settings.subject_prefix}.acme.timer.get", body, timeout=30) for _ in range(500)
            ]
            replies = await asyncio.gather(*gets)
        finally:
            await nc.close()
    assert {json.loads(r.data)["error"] for r in replies} == {"unavailable"}
    failed = [r for r in caplog.records if getattr(r, "action", "") == "get_failed"]
    assert 1 <= len(failed) <= 1 + (time.monotonic() - started) / logs.THROTTLE_S, len(failed)


def _epoch(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


async def test_get_answers_bad_request_for_an_id_no_timer_can_have(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """An id with NUL (Postgres text cannot hold it) or a lone surrogate (no UTF-8 for it) is the
    caller's mistake: bad_request, which a client following the contract does not retry; never
    `unavailable`, never silence, and no database failure logged."""
    caplog.set_level(logging.WARNING, logger="worker")
    async with running_replica(settings):
        nc = await nats.connect(settings.nats_url)
        try:
            for body in (b'{"serviceCallId": "a\\u0000b"}', b'{"serviceCallId": "\\ud800"}'):
                reply = await nc.request(f"{settings.subject_prefix}.acme.timer.get", body, timeout=10)
                answer = json.loads(reply.data)
                assert answer["error"] == "bad_request", (body, answer)
                assert "control character or lone surrogate" in answer["detail"]
        finally:
            await nc.close()
    assert not [r for r in caplog.records if getattr(r, "action", "") == "get_failed"]
