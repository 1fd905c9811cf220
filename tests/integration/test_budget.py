"""The budget of costly next occurrences end to end (worker/core/budget.py): one tenant's schedules
whose next occurrence costs milliseconds leave another tenant's timers on time, against that
tenant's own lateness measured just before with no flood (test_hostile.py's baseline)."""

from __future__ import annotations

import json
import statistics
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.helpers import iso_in, jetstream, query, recorder, running_replica, until, while_progressing
from tests.integration.test_hostile import RATIO, calm_lateness, schedule_body
from worker.config import Settings
from worker.core.recurrence import Repeat, next_occurrence

# And the flood's own work slows with the machine, which the calm baseline (none of it) does not
# show: each costly row is one piece the budgets let start and overdraw (worker/core/budget.py), so
# the allowance adds PIECES of them, timed in this process (the replica's) just before the flood.
PIECES = 10


def costly_piece_s() -> float:
    """What one of the floods' costly rows takes here and now: a minutely cron in a zone whose
    skipped occurrences since 1971 are counted (to the bound), as the replica computes it."""
    repeat = Repeat(None, 1_000_000, "America/New_York", cron="* * * * *")
    since = datetime(1971, 1, 1, tzinfo=UTC)
    took = []
    for _ in range(3):
        began = time.perf_counter()
        next_occurrence(repeat, since, 0, datetime.now(UTC), fired_at=since)
        took.append(time.perf_counter() - began)
    return statistics.median(took)


@pytest.mark.parametrize("flooders", [1, 40])
async def test_costly_schedules_do_not_hold_back_another_tenants_timers(
    settings: Settings, db_url: str, flooders: int
) -> None:
    """Schedules whose next occurrence a tenant makes costly, all overdue since 1971: a minutely
    cron in a zone (its decades of missed minutes were counted one by one, a thousand per row),
    the same with `times` (they count: up to a thousand steps each; 20, or 5 per flooding tenant), and
    one that matches once in decades (milliseconds a step). Stored paused, then resumed at once
    just before another tenant's timers come due: those go out on time. Before the firing loop's
    budget (worker/core/budget.py), they waited behind tens of seconds of counting; with a budget
    per tenant but the loop held until each had spent it, 40 flooding tenants held it seconds."""
    prefix = settings.subject_prefix
    minutely = {"cron": "* * * * *", "timezone": "America/New_York"}
    costly: dict[str, dict[str, Any]] = {
        **{f"minutely-{i}": minutely for i in range(1000)},
        **{f"counted-{i}": {**minutely, "times": 1_000_000} for i in range(max(20, 5 * flooders))},
        **{f"rare-{i}": {"cron": "0 0 * 2 SUN#5"} for i in range(50)},
    }
    tenants = [f"flood{k}" for k in range(flooders)]
    owner = {sc: tenants[i % flooders] for i, sc in enumerate(costly)}
    victims = {f"victim-{i}" for i in range(20)}
    postponed = REGISTRY.get_sample_value("timer_postponed_total", {"reason": "next_occurrence"}) or 0.0
    flood = "SELECT count(*) FROM timers WHERE tenant_id LIKE 'flood%%' AND state = 'Paused'"
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        baseline = await calm_lateness(js, rec, db_url, prefix, len(victims))
        piece = costly_piece_s()
        for t in tenants:
            await js.publish(f"{prefix}.{t}.timer.pause", json.dumps({"tenantId": t}).encode())
        for sc, repeat in costly.items():
            body = schedule_body(owner[sc], sc, "1971-01-01T00:00:00Z", repeat=repeat)
            await js.publish(f"{prefix}.{owner[sc]}.timer.schedule", body)
        await while_progressing(lambda: query(db_url, flood)[0][0], len(costly), what="the flood stored")
        for i, sc in enumerate(sorted(victims)):
            due = iso_in(1.5 + i * 0.1, db_url)
            await js.publish(f"{prefix}.calm.timer.schedule", schedule_body("calm", sc, due))
        for t in tenants:
            await js.publish(f"{prefix}.{t}.timer.resume", json.dumps({"tenantId": t}).encode())
        want = {("calm", sc) for sc in victims} | {(owner[sc], sc) for sc in costly}
        # The flood's counting is a fixed amount of CPU: its wall time is the machine's share, so
        # it is waited on while it moves, not for a fixed time.
        await while_progressing(
            lambda: len(want & rec.keys().keys()), len(want), what="every timer's first firing"
        )
    calm = [f for f in rec.firings if f.service_call_id in victims]
    lateness = [f.received_at - f.due_at for f in calm]
    assert len(calm) == len(victims) and min(lateness) >= 0
    bound = RATIO * baseline + 1.0 + PIECES * piece
    print(
        f"\ncalm tenant beside {flooders} flooding: max lateness {max(lateness) * 1000:.0f} ms"
        f" (calm {baseline * 1000:.0f} ms, a costly row {piece * 1000:.0f} ms)"
    )
    assert max(lateness) < bound, f"a calm tenant's timer was {max(lateness):.2f}s late (bound {bound:.2f}s)"
    # The costly rows really were put off for later claims, not computed in one go.
    assert (
        REGISTRY.get_sample_value("timer_postponed_total", {"reason": "next_occurrence"}) or 0
    ) > postponed


async def test_one_tenants_costly_schedules_do_not_postpone_another_tenants_recurring_timers(
    settings: Settings, db_url: str
) -> None:
    """The budget for costly next occurrences is the replica's, but what overdraws it is one
    tenant's choice: while a flood of schedules whose skipped occurrences are counted (tens of
    milliseconds each) kept it overdrawn, every recurring row met was put back, another tenant's
    hourly timers (microseconds each, never charged) included, claim after claim until the flood
    had drained. Those fire on time; the flood's rows are the ones put off."""
    prefix = settings.subject_prefix
    counted = {"cron": "* * * * *", "timezone": "America/New_York", "times": 1_000_000}
    flood = {f"counted-{i}": counted for i in range(60)}
    victims = {f"hourly-{i}" for i in range(10)}
    paused = "SELECT count(*) FROM timers WHERE tenant_id = 'flood' AND state = 'Paused'"
    hourly = {"every": "PT1H"}
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        baseline = await calm_lateness(js, rec, db_url, prefix, len(victims), repeat=hourly)
        piece = costly_piece_s()
        await js.publish(f"{prefix}.flood.timer.pause", b'{"tenantId": "flood"}')
        for sc, repeat in flood.items():
            body = schedule_body("flood", sc, "1971-01-01T00:00:00Z", repeat=repeat)
            await js.publish(f"{prefix}.flood.timer.schedule", body)
        await while_progressing(lambda: query(db_url, paused)[0][0], len(flood), what="the flood stored")
        for i, sc in enumerate(sorted(victims)):
            due = iso_in(1.5 + i * 0.1, db_url)
            await js.publish(f"{prefix}.calm.timer.schedule", schedule_body("calm", sc, due, repeat=hourly))
        await js.publish(f"{prefix}.flood.timer.resume", b'{"tenantId": "flood"}')
        await until(
            lambda: {("calm", sc) for sc in victims} <= set(rec.keys()), timeout=120, what="calm's firings"
        )
    calm = [f for f in rec.firings if f.service_call_id in victims]
    lateness = [f.received_at - f.due_at for f in calm]
    bound = RATIO * baseline + 1.0 + PIECES * piece
    print(
        f"\ncalm's hourly timers beside the costly flood: max lateness {max(lateness) * 1000:.0f} ms"
        f" (calm {baseline * 1000:.0f} ms, a costly row {piece * 1000:.0f} ms)"
    )
    assert max(lateness) < bound, (
        f"a calm tenant's recurring timer was {max(lateness):.2f}s late (bound {bound:.2f}s)"
    )
