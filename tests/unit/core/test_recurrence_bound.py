"""Property: whatever ScheduleTimer intake accepts, firing it after any downtime takes a bounded
number of steps: two cron steps without `times`, at most CRON_MAX_COUNTED and two with it, and a
few dozen evaluations of an `every` schedule. What a step costs in time is a benchmark's business
(`python -m tools.bench.tenantwork`, docs/BENCHMARKS.md), not a test's.

Fixed seed (derandomize) in `make test`; TIMER_CHAOS_SCALE (`make chaos-soak`) multiplies the examples.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.helpers import property_settings
from worker.contract import ScheduleTimer
from worker.core import recurrence
from worker.core.commands import parse_command
from worker.core.recurrence import CRON_MAX_COUNTED, next_occurrence

FUZZ = property_settings(150)
# Evaluations of an `every` schedule: a gallop and a bisection over at most 2**31 indexes.
EVERY_MAX_EVALUATIONS = 2 * 32 + 2

fields = [
    st.sampled_from(["*", "0", "59", "*/7", "0-59/13", "1,2,3", "5-10"]),
    st.sampled_from(["*", "0", "23", "2", "1-3", "*/5", "9"]),
    st.sampled_from(["*", "1", "29", "30", "31", "L", "15W", "1-7", "28-31", "*/10"]),
    st.sampled_from(["*", "2", "4", "12", "2,4", "JAN-JUN", "*/3"]),
    st.sampled_from(["*", "MON", "SUN#5", "6#5", "5L", "1-5", "MON-FRI", "7"]),
]
zones = st.sampled_from([None, "America/New_York", "Pacific/Apia", "Australia/Lord_Howe", "Asia/Kolkata"])
crons = st.tuples(*fields).map(" ".join)
everys = st.sampled_from(["PT1S", "PT59S", "PT1H", "P1D", "P1M", "P1Y", "P1W", "PT1H30M", "P3M2DT4H"])
instants = st.datetimes(datetime(1970, 1, 1), datetime(2090, 1, 1), timezones=st.just(UTC))


@st.composite
def repeats(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"cron": draw(crons)} if draw(st.booleans()) else {"every": draw(everys)}
    if (zone := draw(zones)) is not None:
        spec["timezone"] = zone
    if draw(st.booleans()):
        spec["times"] = draw(st.integers(1, 2**31 - 1))
    return spec


@FUZZ
@given(spec=repeats(), due=instants, downtime=st.timedeltas(timedelta(0), timedelta(days=365 * 60)))
def test_any_accepted_schedule_fires_after_any_downtime_in_bounded_steps(
    spec: dict[str, Any], due: datetime, downtime: timedelta, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = json.dumps({"tenantId": "acme", "serviceCallId": "x", "dueAt": due.isoformat(), "repeat": spec})
    timer = parse_command(
        "schedule",
        "acme",
        body.encode(),
        now=datetime(2026, 11, 27, tzinfo=UTC),
        max_horizon=timedelta(days=36500),
    )
    assume(isinstance(timer, ScheduleTimer))
    assert isinstance(timer, ScheduleTimer) and timer.repeat is not None
    steps = {"cron": 0, "every": 0}
    cron_after, occurrence = recurrence.cron_after, recurrence._occurrence

    def cron_step(*args: Any) -> Any:
        steps["cron"] += 1
        return cron_after(*args)

    def every_step(*args: Any) -> Any:
        steps["every"] += 1
        return occurrence(*args)

    monkeypatch.setattr(recurrence, "cron_after", cron_step)
    monkeypatch.setattr(recurrence, "_occurrence", every_step)
    try:
        after = timer.due_at + downtime
    except OverflowError:
        return
    next_occurrence(timer.repeat, timer.due_at, 0, after, fired_at=timer.due_at)
    if timer.repeat.cron is None:
        assert steps == {"cron": 0, "every": steps["every"]} and steps["every"] <= EVERY_MAX_EVALUATIONS
    elif timer.repeat.times is None:
        assert steps["cron"] <= 2
    else:
        assert steps["cron"] <= CRON_MAX_COUNTED + 2
