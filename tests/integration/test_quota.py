"""Per-tenant limit on pending timers (TIMER_TENANT_MAX_PENDING, issue 6)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from tests.helpers import iso_in, jetstream, publish_raw, query, row, running_replica, until
from worker.config import Settings
from worker.contract import CancelTimer, Command, ScheduleTimer
from worker.core.quota import over_quota


def _ids(db_url: str, tenant: str, state: str = "Scheduled") -> set[str]:
    rows = query(
        db_url, "SELECT service_call_id FROM timers WHERE tenant_id = %s AND state = %s", tenant, state
    )
    return {sc for (sc,) in rows}


async def test_schedules_over_the_limit_go_to_the_dlq_and_reschedules_pass(
    settings: Settings, db_url: str
) -> None:
    far = iso_in(3600, db_url)
    async with running_replica(settings, tenant_max_pending=3), jetstream(settings) as js:
        dlq = await js.subscribe(f"{settings.subject_prefix}.*.timer.dlq", stream=settings.dlq_stream)
        for i in range(5):
            await publish_raw(js, settings, "acme", "schedule", _schedule("acme", f"a{i}", far))
        for i in range(2):
            await publish_raw(js, settings, "globex", "schedule", _schedule("globex", f"b{i}", far))
        rejected = [await dlq.next_msg(timeout=10) for _ in range(2)]
        await until(lambda: len(_ids(db_url, "acme")) == 3 and len(_ids(db_url, "globex")) == 2)
        assert _ids(db_url, "acme") == {"a0", "a1", "a2"}  # the first three, in stream order
        assert [m.data for m in rejected] == [_body("acme", "a3", far), _body("acme", "a4", far)]
        assert all(m.headers and m.headers["Timer-Error"] == "quota_exceeded" for m in rejected)
        assert {m.subject for m in rejected} == {f"{settings.subject_prefix}.acme.timer.dlq"}

        # At the limit, moving an existing timer is no new timer: accepted.
        soon = iso_in(1800, db_url)
        await publish_raw(js, settings, "acme", "schedule", _schedule("acme", "a0", soon))
        await until(
            lambda: (
                (r := row(db_url, "acme", "a0")) is not None and r["due_at"] < datetime.fromisoformat(far)
            ),
            what="reschedule applied",
        )
        # A cancel makes room for one more.
        await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": "a1"})
        await until(lambda: _ids(db_url, "acme", "Cancelled") == {"a1"}, what="cancel applied")
        await publish_raw(js, settings, "acme", "schedule", _schedule("acme", "a5", far))
        await until(lambda: "a5" in _ids(db_url, "acme"), what="schedule into the freed slot")
        assert _ids(db_url, "acme") == {"a0", "a2", "a5"}
    assert query(db_url, "SELECT count(*) FROM timers WHERE tenant_id = 'acme'") == [(4,)]


def test_the_batch_walk_counts_new_timers_only() -> None:
    due = datetime.now(UTC) + timedelta(hours=1)

    def sched(tenant: str, sc: str) -> ScheduleTimer:
        return ScheduleTimer(tenant, sc, due, None, None, None)

    batch: list[Command] = [
        sched("a", "x"),  # new: 1 of 2
        sched("a", "x"),  # the same key again: a reschedule
        sched("a", "done"),  # Reached: ignored by the store, never counted
        sched("a", "live"),  # Scheduled already: a reschedule
        CancelTimer("a", "live", None, None),
        sched("a", "y"),  # new: 2 of 2
        sched("a", "z"),  # new, over the limit
        sched("b", "z"),  # another tenant, its own count
    ]
    known = {("a", "done"), ("a", "live")}
    assert over_quota(batch, known, {"a": 0, "b": 1}, limit=2) == [6]
    assert over_quota(batch, known, {"a": 2, "b": 2}, limit=2) == [
        0,
        1,
        5,
        6,
        7,
    ]  # x rejected, so its copy is new too


def _body(tenant: str, sc: str, due: str) -> bytes:
    return json.dumps(_schedule(tenant, sc, due)).encode()


def _schedule(tenant: str, sc: str, due: str) -> dict[str, object]:
    return {"tenantId": tenant, "serviceCallId": sc, "dueAt": due}
