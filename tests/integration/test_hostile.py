"""Hostile input on real NATS and Postgres: a flood of garbage while valid timers fire on time,
every piece of garbage acknowledged into the DLQ, and tenants that cannot reach each other."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from datetime import datetime
from typing import Any

import nats
import pytest
from nats.aio.msg import Msg

from tests.helpers import (
    iso_in,
    jetstream,
    query,
    recorder,
    row,
    running_replica,
    until,
)
from worker.config import Settings
from worker.contract import INVALID_TENANT, REASONS, is_valid_tenant


def schedule_body(tenant: str, sc: str, due: str = "2030-01-01T00:00:00Z", **extra: Any) -> bytes:
    return json.dumps({"tenantId": tenant, "serviceCallId": sc, "dueAt": due, **extra}).encode()


# (subject tenant token, kind, body, the reason it must be rejected with)
GARBAGE: list[tuple[str, str, bytes, str]] = [
    ("acme", "schedule", b"\x00\xff\xfe garbage", "invalid_utf8"),
    ("acme", "schedule", b"{not json", "invalid_json"),
    ("acme", "schedule", b"", "invalid_json"),
    ("acme", "schedule", b'{"tenantId": "acme", "serviceCallId": "x", "dueAt": NaN}', "non_finite_number"),
    ("acme", "schedule", b'{"tenantId": "acme", "serviceCallId": "x", "n": -Infinity}', "non_finite_number"),
    ("acme", "schedule", b'{"tenantId": "acme", "tenantId": "acme", "serviceCallId": "x"}', "duplicate_key"),
    ("acme", "schedule", schedule_body("acme", "x", "0001-01-01T00:00:00+01:00"), "bad_due_at"),
    # A real instant, but outside the range every layer holds (west of UTC it was no datetime).
    ("globex", "schedule", schedule_body("globex", "x", "0001-01-01T00:00:00-01:00"), "bad_due_at"),
    ("acme", "schedule", schedule_body("acme", "x", "9999-12-31T23:30:00-01:00"), "bad_due_at"),
    ("acme", "schedule", schedule_body("acme", "a\x00b"), "bad_service_call_id"),
    (
        "acme",
        "schedule",
        b'{"tenantId": "acme", "serviceCallId": "\\ud800", "dueAt": "2030-01-01T00:00:00Z"}',
        "bad_service_call_id",
    ),
    ("acme", "cancel", b'{"tenantId": "acme", "serviceCallId": "\\udfff"}', "bad_service_call_id"),
    ("acme", "schedule", schedule_body("victim", "x"), "tenant_mismatch"),
    ("acme", "cancel", json.dumps({"tenantId": "victim", "serviceCallId": "x"}).encode(), "tenant_mismatch"),
    ("acme", "schedule", schedule_body("acme", "x", "2026-11-22T09:00:00"), "bad_due_at"),
    (
        "acme",
        "schedule",
        b'{"tenantId": "acme", "serviceCallId": "x", "pad": "' + b"x" * 70_000 + b'"}',
        "body_too_large",
    ),
    ("acme", "schedule", b"[" * 50_000 + b"]" * 10_000, "invalid_json"),
    ("globex", "schedule", schedule_body("globex", "x", repeat={"every": "PT0S"}), "bad_repeat"),
    (
        "globex",
        "schedule",
        schedule_body("globex", "x", repeat={"every": "P1D", "timezone": "../../etc/passwd"}),
        "unknown_timezone",
    ),
    # A window or expiry a tenant stretches (a year's window would park its timers for a year
    # past their dueAt; a digit string of megabytes, a parse to match): refused, bounded.
    ("globex", "schedule", schedule_body("globex", "x", window="P365D"), "bad_window"),
    ("globex", "schedule", schedule_body("globex", "x", window="PT" + "9" * 60_000 + "S"), "bad_window"),
    ("globex", "schedule", schedule_body("globex", "x", expireAfter="P30D"), "bad_expire_after"),
    # Subject tokens that are no tenant: routed to the fixed `_invalid` token, never escaped.
    ("émile", "schedule", schedule_body("émile", "x"), "bad_tenant"),
    ("a" * 65, "schedule", schedule_body("a" * 65, "x"), "bad_tenant"),
    ("a+b$c", "cancel", b"{}", "bad_tenant"),
    ("acme\u200b", "schedule", schedule_body("acme\u200b", "x"), "bad_tenant"),
]


MIN_GARBAGE = 3000
# A bystander's lateness beside a flood is bounded by its own lateness with no flood, measured just
# before on the same replica: RATIO times it (a loaded machine slows both alike) plus the bound each
# test had on a quiet machine, as an allowance. A flood that holds the loop for seconds exceeds it.
RATIO = 3.0


async def calm_lateness(js: Any, rec: Any, db_url: str, prefix: str, n: int, **extra: Any) -> float:
    """The worst lateness of `n` timers of tenant `calm` (keys calm-base-*), due over the next
    1.5-2.5 s with nothing else to do: the baseline of the same run."""
    keys = {f"calm-base-{i}" for i in range(n)}
    for i, sc in enumerate(sorted(keys)):
        due = iso_in(1.5 + i / n, db_url)
        await js.publish(f"{prefix}.calm.timer.schedule", schedule_body("calm", sc, due, **extra))
    await until(lambda: {("calm", sc) for sc in keys} <= set(rec.keys()), timeout=60, what="calm baseline")
    return max(f.received_at - f.due_at for f in rec.firings if f.service_call_id in keys)


def dlq_token(tenant: str) -> str:
    return tenant if is_valid_tenant(tenant) else INVALID_TENANT


async def command_stream_empty(settings: Settings) -> bool:
    nc = await nats.connect(settings.nats_url)
    try:
        js = nc.jetstream()
        info = await js.consumer_info(settings.command_stream, settings.consumer)
        stream = await js.stream_info(settings.command_stream)
        return bool(info.num_pending == 0 and info.num_ack_pending == 0 and stream.state.messages == 0)
    finally:
        await nc.close()


async def test_a_flood_of_garbage_ends_in_the_dlq_while_valid_timers_fire_on_time(
    settings: Settings, db_url: str
) -> None:
    valid = {
        # Valid, if odd: they must be stored and fire like any other.
        ("acme", "zero\u200bwidth"),
        ("acme", "注文-7"),
        ("acme", "😀" * 50),
        ("globex", "epoch"),  # 1970-01-01T00:00:00Z, the range's start: in the past, fires at once
    } | {("acme" if i % 2 else "globex", f"on-time-{i}") for i in range(40)}
    prefix = settings.subject_prefix
    published: Counter[tuple[str, str]] = Counter()  # (DLQ token, reason) of each piece of garbage
    mid_flood: set[tuple[str, str]] = set()  # valid commands sent while the garbage kept coming

    async def flood(nc: Any, stop: asyncio.Event) -> None:
        """Garbage as fast as the connection takes it (the big bodies one round in ten), until the
        last valid timer fired and there were thousands."""
        i = 0
        while not stop.is_set() or sum(published.values()) < MIN_GARBAGE:
            for tenant, kind, body, reason in GARBAGE:
                if len(body) > 50_000 and i % 10:
                    continue
                await nc.publish(f"{prefix}.{tenant}.timer.{kind}", body)
                published[(dlq_token(tenant), reason)] += 1
            if i % 20 == 0:  # a valid command in the middle of the garbage, due soon
                sc = f"mid-flood-{i}"
                await nc.publish(f"{prefix}.acme.timer.schedule", schedule_body("acme", sc, iso_in(0.5)))
                mid_flood.add(("acme", sc))
            await nc.flush()
            i += 1
            await asyncio.sleep(0.005)  # let the other coroutines in this loop run

    async with (
        running_replica(settings, intake_batch_size=500),
        recorder(settings) as rec,
        jetstream(settings) as js,
    ):
        baseline = await calm_lateness(js, rec, db_url, prefix, 20)
        for tenant, sc in sorted(valid):
            if sc.startswith("on-time-"):
                due = iso_in(1.0 + int(sc.rsplit("-", 1)[1]) * 0.1, db_url)  # due over 1..5 s from now
            elif sc == "epoch":
                due = "1970-01-01T00:00:00Z"
            else:
                due = iso_in(2.0, db_url)
            await js.publish(f"{prefix}.{tenant}.timer.schedule", schedule_body(tenant, sc, due))
        stop = asyncio.Event()
        flooding = asyncio.create_task(flood(js._nc, stop))
        started = time.monotonic()
        try:
            await until(lambda: set(rec.keys()) >= valid, timeout=60, what="every valid timer fired")
        finally:
            stop.set()
            await flooding
        flooded_for = time.monotonic() - started
        await until(lambda: set(rec.keys()) >= mid_flood, what="every command sent mid-flood fired")
        await until(lambda: command_stream_empty(settings), timeout=120, what="every command acknowledged")
        drained_after = time.monotonic() - started
        # Nothing left to fire; every garbage command is in the DLQ, once.
        dlq = await js.stream_info(settings.dlq_stream)
        headers: Counter[tuple[str, str]] = Counter()
        sub = await js.pull_subscribe(f"{prefix}.*.timer.dlq", stream=settings.dlq_stream)
        while sum(headers.values()) < dlq.state.messages:
            for msg in await sub.fetch(1000, timeout=10):
                assert msg.headers is not None
                headers[(msg.subject.split(".")[1], msg.headers["Timer-Error"])] += 1
                await msg.ack()

    total = sum(published.values())
    assert total >= MIN_GARBAGE
    assert dlq.state.messages == total
    assert headers == published
    assert set(r for _, r in headers) <= REASONS
    # On time, none early, each once (a poison flood must not delay or duplicate anything).
    valid |= mid_flood
    fired = [f for f in rec.firings if (f.tenant_id, f.service_call_id) in valid]
    assert len(fired) == len(valid) == len({(f.tenant_id, f.service_call_id) for f in fired})
    assert len(mid_flood) >= 5
    lateness = [f.received_at - f.due_at for f in fired if f.service_call_id != "epoch"]
    assert min(lateness) >= 0, "a timer fired early"
    bound = RATIO * baseline + 3.0
    print(
        f"\nflood: {total} garbage commands over {flooded_for:.1f}s, all in the DLQ after "
        f"{drained_after:.1f}s; {len(valid)} valid timers ({len(mid_flood)} sent mid-flood), "
        f"max lateness {max(lateness) * 1000:.0f} ms (calm {baseline * 1000:.0f} ms)"
    )
    assert max(lateness) < bound, (
        f"a timer was {max(lateness):.2f}s late during the flood (bound {bound:.2f}s)"
    )
    assert query(db_url, "SELECT count(*) FROM timers") == [(len(valid) + 20,)]


async def test_a_body_at_the_servers_payload_limit_goes_to_the_dlq_too(
    settings: Settings, db_url: str
) -> None:
    """The DLQ copy carries headers; a body that filled max_payload alone must still get there
    (the server refuses an oversized message and drops the connection that sent it)."""
    async with running_replica(settings) as replica, jetstream(settings) as js:
        limit = js._nc.max_payload
        body = b"{" + b" " * (limit - 2) + b"}"
        subject = f"{settings.subject_prefix}.acme.timer.schedule"
        await js.publish(subject, body)
        await js.publish(subject, schedule_body("acme", "after", "2001-01-01T00:00:00Z"))
        await until(lambda: command_stream_empty(settings), timeout=30, what="both commands acknowledged")
        await until(lambda: (row(db_url, "acme", "after") or {}).get("state") == "Reached", what="fired")
        sub = await js.pull_subscribe(f"{settings.subject_prefix}.acme.timer.dlq", stream=settings.dlq_stream)
        (copy,) = await sub.fetch(1, timeout=10)
        assert replica.broker.connected
    assert copy.headers is not None and copy.headers["Timer-Error"] == "body_too_large"
    assert copy.headers["Timer-Body-Truncated"] == str(len(body))
    assert body.startswith(copy.data) and len(copy.data) > limit - 1024


def envelope(outer_tenant: str, payload: bytes) -> bytes:
    return json.dumps(
        {"type": "ScheduleTimer", "tenantId": outer_tenant, "payload": json.loads(payload)}
    ).encode()


async def test_a_tenant_cannot_reach_another_tenants_timers(settings: Settings, db_url: str) -> None:
    prefix = settings.subject_prefix
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        nc = js._nc
        events = await nc.subscribe(f"{prefix}.*.timer.due")
        payroll_due = iso_in(1.5, db_url)
        await js.publish(f"{prefix}.victim.timer.schedule", schedule_body("victim", "payroll", payroll_due))
        await js.publish(f"{prefix}.victim.timer.schedule", schedule_body("victim", "bonus"))
        await until(lambda: row(db_url, "victim", "bonus") is not None, what="victim's timers stored")
        attacks = [
            # Schedule or cancel in the victim's name from the attacker's subject.
            ("schedule", schedule_body("victim", "payroll", iso_in(0.1, db_url))),
            ("schedule", envelope("attacker", schedule_body("victim", "x"))),
            ("schedule", envelope("victim", schedule_body("attacker", "x"))),
            ("cancel", json.dumps({"tenantId": "victim", "serviceCallId": "payroll"}).encode()),
        ]
        for kind, body in attacks:
            await js.publish(f"{prefix}.attacker.timer.{kind}", body)
        # Its own cancel of the same id touches its own (absent) timer only.
        own_cancel = {"tenantId": "attacker", "serviceCallId": "payroll"}
        await js.publish(f"{prefix}.attacker.timer.cancel", json.dumps(own_cancel).encode())
        # An event of the attacker's own is published on the attacker's subject only.
        mine = schedule_body("attacker", "mine", iso_in(0.2, db_url))
        await js.publish(f"{prefix}.attacker.timer.schedule", mine)

        async def get(tenant_token: str, body: dict[str, Any]) -> dict[str, Any]:
            subject = f"{prefix}.{tenant_token}.timer.get"
            reply = await nc.request(subject, json.dumps(body).encode(), timeout=5)
            answer: dict[str, Any] = json.loads(reply.data)
            return answer

        # Reads are scoped by the subject's tenant; a tenantId in the body changes nothing.
        own = await get("victim", {"serviceCallId": "payroll"})
        assert (own["tenantId"], own["serviceCallId"], own["state"]) == ("victim", "payroll", "Scheduled")
        stolen = await get("attacker", {"serviceCallId": "bonus", "tenantId": "victim"})
        assert stolen == {"error": "not_found", "tenantId": "attacker", "serviceCallId": "bonus"}
        # The attacker's own cancel left a tombstone of its own "payroll": that is what it reads.
        await until(lambda: row(db_url, "attacker", "payroll") is not None, what="attacker's cancel applied")
        read = await get("attacker", {"serviceCallId": "payroll", "tenantId": "victim"})
        assert (read["tenantId"], read["state"], read["dueAt"]) == ("attacker", "Cancelled", None)
        for token in ("émile", "a+b", "_" * 65, "victim\u200b"):  # not tenants: refused, not looked up
            assert (await get(token, {"serviceCallId": "payroll"}))["error"] == "bad_request"

        both = {("victim", "payroll"), ("attacker", "mine")}
        await until(lambda: all(rec.keys()[k] == 1 for k in both), what="both fired")
        await until(lambda: command_stream_empty(settings), what="every command acknowledged")
        sub = await js.pull_subscribe(f"{prefix}.*.timer.dlq", stream=settings.dlq_stream)
        rejected: list[Msg] = []
        while len(rejected) < len(attacks):
            rejected += await sub.fetch(len(attacks) - len(rejected), timeout=10)
        seen: list[Msg] = []
        while len(seen) < 2:
            seen.append(await events.next_msg(timeout=10))

    reasons = [(m.subject.split(".")[1], (m.headers or {}).get("Timer-Error")) for m in rejected]
    assert reasons == [("attacker", "tenant_mismatch")] * len(attacks)
    # The victim's timer fired once, at its own dueAt; the attacker's cancel made a tombstone of its
    # own (a cancel may arrive before its schedule), beside the victim's row, not on it.
    due = datetime.fromisoformat(payroll_due).timestamp()
    assert [f.due_at for f in rec.firings if f.tenant_id == "victim"] == [pytest.approx(due, abs=0.001)]
    assert query(db_url, "SELECT tenant_id, service_call_id, state FROM timers ORDER BY 1, 2") == [
        ("attacker", "mine", "Reached"),
        ("attacker", "payroll", "Cancelled"),
        ("victim", "bonus", "Scheduled"),
        ("victim", "payroll", "Reached"),
    ]
    # Every event went out on the subject of the tenant it belongs to.
    for m in seen:
        event = json.loads(m.data)
        assert m.subject.split(".")[1] == event["tenantId"] == event["payload"]["tenantId"]
