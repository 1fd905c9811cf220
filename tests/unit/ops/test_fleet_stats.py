"""The fleet's stats over a range (worker/ops/fleet_stats.py): the bins a range is drawn in keep
every chart within MAX_POINTS, whatever the range and the moment it is read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from worker.adapters.postgres.stats import STATS_KEEP
from worker.ops.console.views import CHART_TTL_S
from worker.ops.fleet_stats import MAX_POINTS, RANGES, step_for

ORIGIN = datetime(2000, 1, 1, tzinfo=UTC)  # console_stats's date_bin origin


def bins(window_min: int, now: datetime) -> int:
    """The bins console_stats returns at most: from the one holding now - window to now's."""
    step = timedelta(minutes=step_for(window_min))
    first = ORIGIN + (now - timedelta(minutes=window_min) - ORIGIN) // step * step
    last = ORIGIN + (now - ORIGIN) // step * step
    return (last - first) // step + 1


@given(
    st.integers(1, int(STATS_KEEP.total_seconds() // 60)),
    st.datetimes(datetime(2001, 1, 1), datetime(2100, 1, 1), timezones=st.just(UTC)),
)
def test_a_range_is_drawn_in_at_most_max_points_bins(window_min: int, now: datetime) -> None:
    assert 1 <= bins(window_min, now) <= MAX_POINTS
    assert step_for(window_min) >= 1


def test_the_ranges_offered_are_kept_and_a_short_one_is_a_minute_a_point() -> None:
    assert max(RANGES.values()) * 60 <= STATS_KEEP.total_seconds()
    assert step_for(RANGES["1h"]) == 1 and step_for(RANGES["7d"]) == 85


def test_the_operations_guide_says_the_ranges_and_points_the_code_draws() -> None:
    guide = " ".join((Path(__file__).parents[3] / "docs" / "OPERATIONS.md").read_text().split())
    assert f"the last {', '.join(list(RANGES)[:-1])} or {list(RANGES)[-1]} at a click" in guide
    assert f"at most {MAX_POINTS} points a chart" in guide
    six, day, week = (step_for(RANGES[r]) for r in ("6h", "24h", "7d"))
    assert step_for(RANGES["1h"]) == 1
    said = f"a point a minute for an hour, per {six} minutes for six hours, per {day} for a day, per {week}"
    assert f"{said} for a week" in guide
    assert CHART_TTL_S == 60 and "is read at most once a minute, not on each look" in guide
