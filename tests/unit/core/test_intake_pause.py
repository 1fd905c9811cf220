"""Intake's pauses and resumes (worker/core/intake.py, apply and _coalesce; docs/USING.md, Pause and
resume): other commands first, then each tenant's last pause or resume; the moot ones superseded."""

from __future__ import annotations

from datetime import UTC, datetime

from tests.unit.core.test_intake import command, fetch_and_handle, setup
from worker.contract import PauseTimers


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
    applied = [(kind, c) for kind, c in store.log if kind in ("apply", "pause")]
    # The flood's last (a pause) runs once, after every other command of the batch.
    assert [k for k, _ in applied] == ["apply", "pause", "apply", "pause", "pause"]
    assert [c.service_call_id for c in applied[0][1]] == ["v"]
    assert applied[1][1] == PauseTimers("acme", "k", True, None)
    assert applied[3][1] == PauseTimers("acme", "k", False, None)
    assert applied[4][1] == PauseTimers("noisy", None, False, None)
    for msg in [*flood, other, *mine]:
        assert broker.acks.of(msg.metadata.sequence.stream) == ["+ACK"], msg.subject
