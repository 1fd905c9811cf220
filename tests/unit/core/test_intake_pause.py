"""Intake's pauses and resumes (worker/core/intake.py, apply; docs/USING.md, Pause and resume): a
tenant's to the bulk lane after the batch's other commands, the moot ones superseded; a run of one
timer's each, any tenants', in one store call between the batch's ScheduleTimers and CancelTimers."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.twins import TwinStore, claim_params
from tests.unit.core.test_intake import command, fetch_and_handle, setup
from worker.contract import PauseTimers
from worker.core.domain import Applied, Position
from worker.errors import TransientError


def calls(store: TwinStore) -> list[tuple[str, Any]]:
    return [(kind, c) for kind, c in store.log if kind in ("apply", "pause", "pause_timers")]


async def test_a_tenants_controls_come_after_the_batchs_other_commands_and_only_its_last_applies() -> None:
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    s = broker.subjects
    flood = [
        broker.add(s.of("noisy", "pause" if i % 2 == 0 else "resume"), {"tenantId": "noisy"})
        for i in range(5)
    ]
    other = broker.add(s.of("victim", "schedule"), command("ScheduleTimer", "victim", "v", due))
    mine = [
        broker.add(s.of("acme", "pause"), {"tenantId": "acme", "serviceCallId": "k"}),
        broker.add(
            s.of("acme", "resume"), {"tenantId": "acme", "serviceCallId": "k"}
        ),  # supersedes the pause
        broker.add(s.of("acme", "schedule"), command("ScheduleTimer", "acme", "k", due)),
        broker.add(
            s.of("acme", "pause"), {"tenantId": "acme", "serviceCallId": "k"}
        ),  # not moot: a schedule between
    ]
    await fetch_and_handle(broker, intake)
    applied = calls(store)
    # The flood's last (a pause) runs once, after every other command of the batch.
    assert [k for k, _ in applied] == ["apply", "pause_timers", "apply", "pause_timers", "pause"]
    assert [c.service_call_id for c in applied[0][1]] == ["v"]
    assert applied[1][1] == [PauseTimers("acme", "k", True, None)]
    assert applied[3][1] == [PauseTimers("acme", "k", False, None)]
    assert applied[4][1] == PauseTimers("noisy", None, False, None)
    for msg in [*flood, other, *mine]:
        assert broker.acks.of(msg.metadata.sequence.stream) == ["+ACK"], msg.subject


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_burst_of_one_timer_controls_of_many_tenants_is_one_store_call_each_answered_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    time, store, broker, intake = setup()
    s = broker.subjects
    tenants = ("t0", "t1", "t2")
    later, soon = (datetime.fromtimestamp(time.t + d, UTC) for d in (60, 0.5))
    for t in tenants:
        for key in ("a", "b"):
            broker.add(s.of(t, "schedule"), command("ScheduleTimer", t, key, later))
    broker.add(s.of("t0", "schedule"), command("ScheduleTimer", "t0", "soon", soon))
    broker.add(
        s.of("t1", "schedule"), command("ScheduleTimer", "t1", "held", datetime.fromtimestamp(time.t, UTC))
    )
    await fetch_and_handle(broker, intake)
    for t, key in [*((t, "b") for t in tenants), ("t0", "soon")]:
        broker.add(s.of(t, "pause"), {"tenantId": t, "serviceCallId": key})
    await fetch_and_handle(broker, intake)
    await store.claim(claim_params("firing", 10, 0, lease_ms=3000))  # t1's "held" in flight
    store.log.clear()
    broker.hints.clear()
    caplog.set_level(logging.INFO, logger="worker.core.intake")
    before = {
        (k, o): sample("timer_commands_applied_total", kind=k, outcome=o)
        for k in ("pause", "resume")
        for o in ("applied", "ignored", "deferred")
    }

    burst = [
        *((t, "a", False) for t in tenants),
        *((t, "b", True) for t in tenants),
        ("t0", "soon", True),
        ("t2", "missing", False),  # no such timer: ignored
        ("t1", "held", False),  # its occurrence is being fired: deferred
    ]
    msgs = [
        broker.add(s.of(t, "resume" if resume else "pause"), {"tenantId": t, "serviceCallId": key})
        for t, key, resume in burst
    ]
    await fetch_and_handle(broker, intake)

    # One store call, then the answers: none before it committed.
    assert [kind for kind, _ in store.log] == ["pause_timers"] + ["ack"] * (len(burst) - 1) + ["nak"]
    assert store.log[0][1] == [PauseTimers(t, key, resume) for t, key, resume in burst]
    answers = [broker.acks.of(m.metadata.sequence.stream) for m in msgs]
    assert answers == [["+ACK"]] * (len(burst) - 1) + [['-NAK {"delay": 3000000000}']]
    assert [store.rows[t, k].state for t in tenants for k in "ab"] == ["Paused", "Scheduled"] * 3
    assert store.rows["t0", "soon"].state == "Scheduled"
    # The soonest dueAt the resumes made claimable wakes the fleet, once.
    assert broker.hints == [(s.wake, f"{soon.timestamp():.3f}".encode())]
    # Counted and logged per command, as one by one.
    counted = {
        key: sample("timer_commands_applied_total", kind=key[0], outcome=key[1]) - n
        for key, n in before.items()
    }
    assert counted == {
        ("pause", "applied"): 3,
        ("pause", "ignored"): 1,
        ("pause", "deferred"): 1,
        ("resume", "applied"): 4,
        ("resume", "ignored"): 0,
        ("resume", "deferred"): 0,
    }
    logged = [
        (r.action, r.tenant, r.service_call_id, r.outcome)
        for r in caplog.records
        if getattr(r, "action", None) in ("timers_paused", "timers_resumed")
    ]
    assert logged == [
        *(("timers_paused", t, "a", "applied") for t in tenants),
        *(("timers_resumed", t, "b", "applied") for t in tenants),
        ("timers_resumed", "t0", "soon", "applied"),
        ("timers_paused", "t2", "missing", "ignored"),
        ("timers_paused", "t1", "held", "deferred"),
    ]


async def test_runs_of_one_timer_controls_are_cut_where_a_schedule_or_cancel_comes_between() -> None:
    time, store, broker, intake = setup()
    s = broker.subjects
    due = datetime.fromtimestamp(time.t + 60, UTC)
    broker.add(s.of("acme", "pause"), {"tenantId": "acme", "serviceCallId": "a"})
    broker.add(s.of("other", "resume"), {"tenantId": "other", "serviceCallId": "a"})
    broker.add(s.of("acme", "pause"), {"tenantId": "acme", "labels": {"g": "1"}})  # the lane's: no cut
    broker.add(s.of("acme", "resume"), {"tenantId": "acme", "serviceCallId": "b"})
    broker.add(s.of("acme", "schedule"), command("ScheduleTimer", "acme", "c", due))
    broker.add(s.of("acme", "pause"), {"tenantId": "acme", "serviceCallId": "c"})
    broker.add(s.of("acme", "cancel"), command("CancelTimer", "acme", "d", ts=2))
    broker.add(s.of("acme", "pause"), {"tenantId": "acme", "serviceCallId": "d"})
    await fetch_and_handle(broker, intake)
    ran = [(kind, [(c.tenant_id, c.service_call_id) for c in cs]) for kind, cs in calls(store)]
    assert ran == [
        ("pause_timers", [("acme", "a"), ("other", "a"), ("acme", "b")]),
        ("apply", [("acme", "c")]),
        ("pause_timers", [("acme", "c")]),
        ("apply", [("acme", "d")]),
        ("pause_timers", [("acme", "d")]),
    ]


class FailingOnce(TwinStore):
    """A store whose first pause_timers meets a dropped connection, and nothing after it."""

    failed = False

    async def pause_timers(
        self, commands: Sequence[PauseTimers], positions: Sequence[Position] | None = None
    ) -> Applied:
        if not self.failed:
            self.failed = True
            raise TransientError("postgres: connection lost")
        return await super().pause_timers(commands, positions)


async def test_a_run_of_controls_that_met_a_transient_error_is_tried_again_before_any_answer() -> None:
    time, store, broker, intake = setup(store_type=FailingOnce)
    due = datetime.fromtimestamp(time.t + 60, UTC)
    broker.add(broker.subjects.of("acme", "schedule"), command("ScheduleTimer", "acme", "k", due))
    await fetch_and_handle(broker, intake)
    store.log.clear()
    for key in ("k", "j"):
        broker.add(broker.subjects.of("acme", "pause"), {"tenantId": "acme", "serviceCallId": key})
    await fetch_and_handle(broker, intake)
    assert [kind for kind, _ in store.log] == ["pause_timers", "ack", "ack"]
    assert store.rows["acme", "k"].state == "Paused"
