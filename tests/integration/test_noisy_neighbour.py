"""Noisy neighbours: for every form a tenant sends (worker.core.commands.FORMS), one tenant's flood of
it, as big as its quota and the limits allow, leaves another tenant's ordinary timers stored and fired
within a small multiple of their calm latency (measured first, in the same run), and every replica's
/healthz at 200 throughout. Two `timer-service run` processes on one database and stream set, shared
by the cases; each case's tenants are its own. TIMER_CHAOS_SCALE=10 (`make chaos-soak`) floods ten
times as much."""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest

from tests.helpers import consumer_idle, jetstream, query, recorder, settings_env, until
from tests.integration.neighbours import (
    SAMPLE_EVERY_S,
    SAMPLES,
    Latencies,
    Rig,
    all_healthy,
    listening_ports,
    measure,
    watching_health,
)
from tests.servers import Servers, delete_streams, fresh_database, own_names
from worker.contract import DEFAULT_MAX_PAYLOAD_BYTES, MAX_LABEL_VALUE_CHARS, MAX_LABELS, Subjects
from worker.core import lane
from worker.core.commands import FORMS, Form, form_kind
from worker.devkit.harness import ReplicaSet
from worker.settings import load_settings

SCALE = float(os.environ.get("TIMER_CHAOS_SCALE", "1"))
COMMANDS = round(2000 * SCALE)  # a flood of commands each about one timer
HELD = round(20_000 * SCALE)  # the labelled timers a bulk flood acts on
BULK = round(200 * SCALE)  # a flood of commands each about many timers
GETS = round(5000 * SCALE)
REPLICAS = 2
# The bound on the calm tenant's p99 beside a flood: a multiple of its calm p99, so a slow machine
# (two cores shared with other test runs) moves both, plus an allowance for what a fair intake
# still costs a bystander: a fetch wait (intake.FETCH_WAIT_S) and a batch or two of the flood.
RATIO = 5.0
ALLOWANCE_S = 2.0
# Past this after the case, what is left of a flood is dropped so the next case starts calm.
SETTLE_S = 20.0 * SCALE

SELECTOR = {"g": "1"}
# Test-only SQL: a tenant's timers as intake stores them, due in a day, each carrying SELECTOR.
HOLD_SQL = """
INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, labels, paused_at)
SELECT %(tenant)s, 'held-' || g, %(state)s, now() + interval '1 day', now() + interval '1 day',
       '{"g": "1"}'::jsonb, CASE WHEN %(own_pause)s THEN now() END
FROM generate_series(0, %(n)s - 1) g
"""
Held = Literal["scheduled", "paused", "tenant_paused"]


@dataclass(frozen=True)
class Flood:
    """The noisy tenant's `count` commands on its form's subject, the i-th `body(tenant, i, now)`,
    after it holds `held` timers (held-0, held-1, …) in `held_as`."""

    body: Callable[[str, int, datetime], dict[str, Any]]
    count: int
    held: int = 0
    held_as: Held = "scheduled"


def schedule(**extra: Any) -> Callable[[str, int, datetime], dict[str, Any]]:
    """The i-th ScheduleTimer of a flood, due at once (or `later`), with `extra` fields."""
    later = extra.pop("later", False)

    def body(tenant: str, i: int, now: datetime) -> dict[str, Any]:
        due = now + timedelta(hours=1) if later else now
        return {"tenantId": tenant, "serviceCallId": f"flood-{i}", "dueAt": due.isoformat(), **extra}

    return body


def by_id(tenant: str, i: int, now: datetime) -> dict[str, Any]:
    return {"tenantId": tenant, "serviceCallId": f"held-{i}"}


def by_labels(tenant: str, i: int, now: datetime) -> dict[str, Any]:
    return {"tenantId": tenant, "labels": SELECTOR}


def whole_tenant(tenant: str, i: int, now: datetime) -> dict[str, Any]:
    return {"tenantId": tenant}


def get(tenant: str, i: int, now: datetime) -> dict[str, Any]:
    return {"serviceCallId": f"held-{i % COMMANDS}"}


# The widest `data` and labels the defaults allow: their bytes are what intake, Postgres and every
# event carry.
DATA = "x" * (DEFAULT_MAX_PAYLOAD_BYTES - 16)
LABELS = {f"k{n}": "v" * MAX_LABEL_VALUE_CHARS for n in range(MAX_LABELS)}
# Recurring floods start in an hour: what they cost is intake's (first occurrences), not firing's.
NEW_YORK = "America/New_York"

FLOODS: dict[Form, Flood] = {
    "schedule.once": Flood(schedule(), COMMANDS),
    "schedule.cron": Flood(
        schedule(later=True, repeat={"cron": "*/5 * * * *", "timezone": NEW_YORK}), COMMANDS
    ),
    "schedule.every": Flood(schedule(later=True, repeat={"every": "PT1M", "timezone": NEW_YORK}), COMMANDS),
    "schedule.data": Flood(schedule(data=DATA), COMMANDS),
    "schedule.labels": Flood(schedule(labels=LABELS), COMMANDS),
    "schedule.window": Flood(schedule(window="PT2S"), COMMANDS),
    "schedule.expire_after": Flood(schedule(expireAfter="PT1S"), COMMANDS),
    "cancel.id": Flood(by_id, COMMANDS, COMMANDS),
    "cancel.labels": Flood(by_labels, BULK, HELD),
    "pause.id": Flood(by_id, COMMANDS, COMMANDS),
    "pause.labels": Flood(by_labels, BULK, HELD),
    "pause.tenant": Flood(whole_tenant, BULK, HELD),
    "resume.id": Flood(by_id, COMMANDS, COMMANDS, "paused"),
    "resume.labels": Flood(by_labels, BULK, HELD, "paused"),
    "resume.tenant": Flood(whole_tenant, BULK, HELD, "tenant_paused"),
    "get": Flood(get, GETS, COMMANDS),
}


@dataclass
class Module:
    rig: Rig
    calm: Latencies  # the calm tenant alone, before any flood

    def bound(self, calm_p99: float) -> float:
        return RATIO * calm_p99 + ALLOWANCE_S


@pytest.fixture(scope="module")
async def module(
    servers: Servers, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Module]:
    """The replicas, the database and streams every case shares, and the calm tenant measured alone."""
    tag = f"n{uuid.uuid4().hex[:8]}"
    logs = tmp_path_factory.mktemp("neighbours")
    with fresh_database(servers.pg_url) as db_url:
        # JSON logs: each replica's port is read from its http_listening line.
        settings = load_settings(
            database_url=db_url, nats_url=servers.nats_url, log_format="json", **own_names(tag)
        )
        try:
            with ReplicaSet(settings_env(settings), logs) as fleet:
                names = fleet.start(REPLICAS)
                ports = await until(
                    lambda: listening_ports(logs, names), timeout=60, what="replicas listening"
                )
                await until(lambda: all_healthy(ports), timeout=60, interval=0.2, what="replicas healthy")
                async with jetstream(settings) as js, recorder(settings) as rec:
                    rig = Rig(settings, db_url, ports, js, rec)
                    async with watching_health(ports) as health:
                        calm = await measure(rig, "calm", wait_s=30)
                    print(f"\ncalm alone: {calm}; {health}")
                    assert not calm.missing and not health.sick, f"calm alone: {calm}; {health}"
                    yield Module(rig, calm)
                assert fleet.alive() == names, log_tails(logs, names)
        finally:
            await delete_streams(servers.nats_url, tag)


def log_tails(logs: Path, names: list[str]) -> str:
    return "\n".join(f"{n}: {(logs / f'{n}.log').read_text(errors='replace')[-2000:]}" for n in names)


def test_every_form_has_a_flood() -> None:
    assert set(FLOODS) == FORMS
    subjects = Subjects("svc")
    sent = {where[1] for s in subjects.commands if (where := subjects.split(s))} | {"get"}
    assert {form_kind(f) for f in FLOODS} == sent


def hold(rig: Rig, tenant: str, flood: Flood) -> None:
    """The noisy tenant's timers before its flood, inserted as intake would have stored them."""
    if not flood.held:
        return
    state = "Scheduled" if flood.held_as == "scheduled" else "Paused"
    params = {"tenant": tenant, "state": state, "own_pause": flood.held_as == "paused", "n": flood.held}
    with psycopg.connect(rig.db_url, autocommit=True) as conn:
        conn.execute(HOLD_SQL, params)
        if flood.held_as == "tenant_paused":
            conn.execute("INSERT INTO paused_tenants (tenant_id, paused_at) VALUES (%s, now())", (tenant,))
        conn.execute("ANALYZE timers")


async def send(rig: Rig, form: Form, tenant: str, flood: Flood) -> float:
    """The flood, pipelined as fast as the connection takes it; how long sending took."""
    started, now = time.monotonic(), datetime.now(UTC)
    kind = form_kind(form)
    bodies = (json.dumps(flood.body(tenant, i, now)).encode() for i in range(flood.count))
    if kind == "get":
        nc = rig.js._nc
        inbox = nc.new_inbox()
        sub = await nc.subscribe(inbox)  # the answers, dropped with it
        for body in bodies:
            await nc.publish(rig.subject(tenant, "get"), body, reply=inbox)
        await nc.flush()
        await sub.unsubscribe()
    else:
        acks = [await rig.js.publish_async(rig.subject(tenant, kind), body) for body in bodies]
        await asyncio.gather(*acks)
    return time.monotonic() - started


def drop(db_url: str, tenant: str) -> bool | None:
    """Delete a tenant's timers; None when a replica's own writes to them made it a deadlock."""
    try:
        query(db_url, "DELETE FROM timers WHERE tenant_id = %s", tenant)
    except psycopg.errors.DeadlockDetected:
        return None
    return True


async def settle(rig: Rig, tenant: str) -> str:
    """The flood handled (every command acknowledged, its timers due by now fired); past SETTLE_S,
    what is left of it dropped. Then every replica healthy again."""
    started = time.monotonic()
    busy = (
        "SELECT count(*) FROM timers WHERE tenant_id = %s AND state = 'Scheduled'"
        " AND due_at < now() + interval '1 minute'"
    )

    async def handled() -> bool:
        return await consumer_idle(rig.settings) and query(rig.db_url, busy, tenant) == [(0,)]

    try:
        await until(handled, timeout=SETTLE_S, interval=0.2, what="the flood handled")
        said = f"handled {time.monotonic() - started:.1f} s after"
    except TimeoutError:
        await rig.js._jsm.purge_stream(rig.settings.command_stream, subject=rig.subject(tenant, "*"))
        # The batch a replica has in hand goes on: without its timers it has nothing left to do.
        await until(
            lambda: asyncio.to_thread(drop, rig.db_url, tenant), timeout=60, what="its timers deleted"
        )
        await until(handled, timeout=60, interval=0.2, what="the flood purged")
        said = f"not handled {SETTLE_S:.0f} s after: purged"
    await until(lambda: all_healthy(rig.ports), timeout=60, interval=0.2, what="replicas healthy again")
    return said


@pytest.mark.parametrize("form", sorted(FLOODS))
async def test_a_flood_leaves_another_tenants_timers_on_time(module: Module, form: Form) -> None:
    rig, calm, flood = module.rig, module.calm, FLOODS[form]
    noisy, quiet = f"noisy-{form.replace('.', '-')}", f"quiet-{form.replace('.', '-')}"
    await until(lambda: all_healthy(rig.ports), timeout=60, interval=0.2, what="replicas healthy")
    hold(rig, noisy, flood)
    store_bound, fire_bound = module.bound(calm.store_p99), module.bound(calm.fire_p99)
    sending: list[float] = []

    async def flooding() -> None:
        sending.append(await send(rig, form, noisy, flood))

    async with watching_health(rig.ports) as health:
        beside = await measure(
            rig, quiet, wait_s=fire_bound + 2 * SAMPLES * SAMPLE_EVERY_S, beside=flooding()
        )
        settled = await settle(rig, noisy)
    report = (
        f"{form}: {flood.count} commands ({flood.held} timers held) sent in {sending[0]:.1f} s, {settled};"
        f" calm {calm}; beside the flood {beside}; bounds {store_bound:.2f} s / {fire_bound:.2f} s; {health}"
    )
    print("\n" + report)
    assert beside.store_p99 <= store_bound, report
    assert beside.fire_p99 <= fire_bound, report
    assert not health.sick, report


BACKLOG = round(6000 * SCALE)  # bulk commands of distinct selectors: none moot, far more than a lane holds


async def pending(rig: Rig) -> tuple[int, int]:
    """(the command consumer's undelivered, its delivered and unacknowledged)."""
    info = await rig.js.consumer_info(rig.settings.command_stream, rig.settings.consumer)
    return int(info.num_pending or 0), int(info.num_ack_pending or 0)


async def test_a_backlog_of_bulk_commands_holds_no_more_unacknowledged_than_the_lanes_do(
    module: Module,
) -> None:
    """Unacknowledged commands share one bound (the consumer's max_ack_pending) for every tenant: once
    the backlog is delivered, what is left unacknowledged is what the lanes hold and a batch each."""
    rig = module.rig
    sent = [
        await rig.js.publish_async(
            rig.subject("backlog", "cancel"),
            json.dumps({"tenantId": "backlog", "labels": {"k": str(i)}}).encode(),
        )
        for i in range(BACKLOG)
    ]
    await asyncio.gather(*sent)
    delivered = await until(
        lambda: _delivered(rig), timeout=60 * SCALE, interval=0.05, what="the backlog delivered"
    )
    bound = REPLICAS * (lane.HELD_MAX + rig.settings.intake_batch_size)
    assert delivered <= bound, f"{delivered} unacknowledged once {BACKLOG} were delivered (bound {bound})"
    said = await settle(rig, "backlog")
    assert said.startswith("handled"), said


async def _delivered(rig: Rig) -> int | None:
    undelivered, unacknowledged = await pending(rig)
    return unacknowledged if undelivered == 0 else None
