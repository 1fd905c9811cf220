"""Recurring timers: anchored calendar arithmetic, wall-clock time across DST, missed windows."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.contract import LATEST_DUE_AT, Repeat
from worker.core.recurrence import MAX_INDEX, Period, next_occurrence, occurrence, parse_period

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def fire_on_time(repeat: Repeat, anchor: datetime, count: int) -> list[datetime]:
    """The first `count` occurrences (anchor included) of a timer that always fires on time."""
    seen, index, due = [anchor], 0, anchor
    while len(seen) < count:
        nxt = next_occurrence(repeat, anchor, index, after=due)
        if nxt is None:
            break
        due, index = nxt
        seen.append(due)
    return seen


def test_daily_nine_local_in_berlin_across_both_dst_changes() -> None:
    anchor = datetime(2026, 3, 27, 9, tzinfo=BERLIN)  # CET, 08:00Z
    days = fire_on_time(Repeat("P1D", None, "Europe/Berlin"), anchor, 220)
    assert len(days) == 220
    assert all(d.tzinfo is UTC for d in days[1:])
    assert all(d.astimezone(BERLIN).time().isoformat() == "09:00:00" for d in days)
    assert [d.date() for d in days] == [anchor.date() + timedelta(days=i) for i in range(220)]
    assert days[1] == utc(2026, 3, 28, 8)  # last day of CET
    assert days[2] == utc(2026, 3, 29, 7)  # first day of CEST
    by_date = {d.date(): d for d in days}
    assert by_date[datetime(2026, 10, 24).date()] == utc(2026, 10, 24, 7)  # last day of CEST
    assert by_date[datetime(2026, 10, 25).date()] == utc(2026, 10, 25, 8)  # CET again


def test_new_york_0230_on_spring_forward_day_fires_at_0330_edt() -> None:
    anchor = utc(2026, 3, 7, 7, 30)  # 02:30 EST
    days = fire_on_time(Repeat("P1D", None, "America/New_York"), anchor, 3)
    assert days[1] == utc(2026, 3, 8, 7, 30)  # 02:30 does not exist: 03:30 EDT
    assert days[1].astimezone(NEW_YORK).strftime("%H:%M %Z") == "03:30 EDT"
    assert days[2] == utc(2026, 3, 9, 6, 30)  # back to 02:30, now EDT
    assert days[2].astimezone(NEW_YORK).strftime("%H:%M %Z") == "02:30 EDT"


def test_new_york_0130_on_fall_back_day_fires_once_at_the_first_instant() -> None:
    anchor = utc(2026, 10, 31, 5, 30)  # 01:30 EDT
    repeat = Repeat("P1D", None, "America/New_York")
    days = fire_on_time(repeat, anchor, 3)
    assert days[1] == utc(2026, 11, 1, 5, 30)  # 01:30 EDT, the first of the two 01:30s
    assert days[1].astimezone(NEW_YORK).strftime("%H:%M %Z") == "01:30 EDT"
    assert days[2] == utc(2026, 11, 2, 6, 30)  # 01:30 EST the next day
    # Not again at the second 01:30 (EST, 06:30Z) of the fall-back day.
    assert next_occurrence(repeat, anchor, 1, after=utc(2026, 11, 1, 5, 30)) == (days[2], 2)


def test_hourly_with_a_timezone_is_wall_clock_time() -> None:
    """Documented: with a timezone, PT1H steps the local clock, so the repeated hour is skipped."""
    anchor = utc(2026, 11, 1, 4, 30)  # 00:30 EDT
    hours = fire_on_time(Repeat("PT1H", None, "America/New_York"), anchor, 4)
    assert hours[1:] == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 1, 7, 30), utc(2026, 11, 1, 8, 30)]


def test_hourly_in_utc_is_elapsed_time() -> None:
    anchor = datetime(2026, 11, 1, 0, 30, tzinfo=NEW_YORK)  # the anchor's own zone does not matter
    hours = fire_on_time(Repeat("PT1H", None, None), anchor, 5)
    # In UTC: aware arithmetic in a ZoneInfo zone would itself be wall-clock time.
    assert hours[1:] == [utc(2026, 11, 1, 4 + h, 30) for h in range(1, 5)]
    assert all(h.tzinfo is UTC for h in hours[1:])


def test_monthly_from_january_31_clamps_each_month_from_the_anchor() -> None:
    months = fire_on_time(Repeat("P1M", None, None), utc(2026, 1, 31, 12), 6)
    assert [d.date().isoformat() for d in months] == [
        "2026-01-31",
        "2026-02-28",
        "2026-03-31",
        "2026-04-30",
        "2026-05-31",
        "2026-06-30",
    ]
    assert all(d.hour == 12 for d in months)
    leap = fire_on_time(Repeat("P1M", None, None), utc(2028, 1, 31), 3)
    assert [d.date().isoformat() for d in leap] == ["2028-01-31", "2028-02-29", "2028-03-31"]


def test_yearly_from_february_29() -> None:
    years = fire_on_time(Repeat("P1Y", None, "Europe/Berlin"), datetime(2024, 2, 29, 9, tzinfo=BERLIN), 5)
    assert [d.astimezone(BERLIN).date().isoformat() for d in years] == [
        "2024-02-29",
        "2025-02-28",
        "2026-02-28",
        "2027-02-28",
        "2028-02-29",
    ]
    assert all(d.astimezone(BERLIN).hour == 9 for d in years)


def test_months_and_days_together() -> None:
    # P1M1D: occurrence k adds k months (clamped), then k days.
    assert occurrence(Repeat("P1M1D", None, None), utc(2026, 1, 31), 1) == utc(2026, 3, 1)
    assert occurrence(Repeat("P1M1D", None, None), utc(2026, 1, 31), 2) == utc(2026, 4, 2)


def test_times_counts_every_occurrence_including_the_first() -> None:
    anchor = utc(2026, 1, 1)
    assert fire_on_time(Repeat("PT1H", 3, None), anchor, 10) == [
        anchor + timedelta(hours=h) for h in range(3)
    ]
    assert next_occurrence(Repeat("PT1H", 1, None), anchor, 0, after=anchor) is None
    assert next_occurrence(Repeat("PT1H", 3, None), anchor, 2, after=utc(2000, 1, 1)) is None


def test_a_missed_window_fires_once_and_skipped_occurrences_count() -> None:
    anchor = utc(2026, 1, 1)
    back_up = anchor + timedelta(hours=5, minutes=30)  # occurrences 1..5 were missed
    assert next_occurrence(Repeat("PT1H", None, None), anchor, 0, after=back_up) == (
        anchor + timedelta(hours=6),
        6,
    )
    assert next_occurrence(Repeat("PT1H", 7, None), anchor, 0, after=back_up) == (
        anchor + timedelta(hours=6),
        6,
    )
    # Occurrences 1..5 used up five of the six: nothing is left after the skipped window.
    assert next_occurrence(Repeat("PT1H", 6, None), anchor, 0, after=back_up) is None
    # Strictly after: an occurrence due exactly at `after` is skipped too.
    assert next_occurrence(Repeat("PT1H", None, None), anchor, 0, after=anchor + timedelta(hours=2)) == (
        anchor + timedelta(hours=3),
        3,
    )


def test_a_due_occurrence_still_ahead_is_the_next_one() -> None:
    """Fired early relative to `after` (a clock behind): the next index, not a later one."""
    anchor = utc(2026, 1, 1)
    assert next_occurrence(Repeat("P1D", None, None), anchor, 3, after=utc(2000, 1, 1)) == (
        utc(2026, 1, 5),
        4,
    )


def test_years_of_downtime_on_a_one_second_period_is_a_search_not_a_walk() -> None:
    anchor = utc(2016, 1, 1)
    after = utc(2026, 1, 1, 0, 0, 0, 500_000)
    started = time.perf_counter()
    result = next_occurrence(Repeat("PT1S", None, "Europe/Berlin"), anchor, 0, after=after)
    assert time.perf_counter() - started < 0.1
    elapsed = int((utc(2026, 1, 1, 0, 0, 1) - anchor).total_seconds())
    assert result == (utc(2026, 1, 1, 0, 0, 1), elapsed)


def test_the_calendar_end_ends_the_schedule() -> None:
    anchor = utc(9999, 6, 1)
    assert next_occurrence(Repeat("P1M", None, None), anchor, 6, after=anchor) is None
    assert next_occurrence(Repeat("P1Y", None, None), anchor, 0, after=anchor) is None
    east = Repeat("P1D", None, "Pacific/Kiritimati")  # UTC+14
    assert next_occurrence(east, utc(9999, 12, 30), 0, after=anchor) == (utc(9999, 12, 31), 1)
    assert next_occurrence(east, utc(9999, 12, 30), 1, after=anchor) is None
    assert next_occurrence(east, utc(9999, 12, 31, 12), 0, after=anchor) is None  # local time is year 10000


def test_indexes_stop_at_the_column_limit() -> None:
    anchor = utc(1970, 1, 1)
    assert next_occurrence(Repeat("PT1S", None, None), anchor, MAX_INDEX, after=anchor) is None
    assert next_occurrence(Repeat("PT1S", None, None), anchor, 0, after=utc(2100, 1, 1)) is None


@pytest.mark.parametrize(
    ("text", "period"),
    [
        ("PT1H", Period(0, timedelta(hours=1))),
        ("PT1S", Period(0, timedelta(seconds=1))),
        ("P1D", Period(0, timedelta(days=1))),
        ("P2W", Period(0, timedelta(days=14))),
        ("P1M", Period(1, timedelta(0))),
        ("P1Y", Period(12, timedelta(0))),
        ("P1Y2M3DT4H", Period(14, timedelta(days=3, hours=4))),
        ("PT1.5H", Period(0, timedelta(minutes=90))),
    ],
)
def test_parse_period(text: str, period: Period) -> None:
    assert parse_period(text) == period


@pytest.mark.parametrize(
    "text", ["", "P", "PT", "P0D", "PT0S", "-P1D", "+P1D", "PT0.5S", "P1.5M", "P0.5Y", "1D", "P1D ", "PT1H\n"]
)
def test_parse_period_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_period(text)


PERIODS = ["PT1H", "PT90M", "PT25H", "P1D", "P1W", "P1M", "P1M1D", "P3M", "P1Y"]
ZONES = [
    None,
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
    "Pacific/Apia",
]


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(PERIODS),
    st.none() | st.integers(1, 500),
    st.sampled_from(ZONES),
    st.datetimes(min_value=datetime(1990, 1, 1), max_value=datetime(2040, 1, 1)),
    st.integers(0, 300),
    st.timedeltas(min_value=timedelta(days=-30), max_value=timedelta(days=3000)),
)
def test_next_is_the_first_unfired_occurrence_after(
    every: str, times: int | None, zone: str | None, start: datetime, fired: int, downtime: timedelta
) -> None:
    repeat = Repeat(every, times, zone)
    anchor = start.replace(tzinfo=UTC)
    fired_at = occurrence(repeat, anchor, fired)
    assert fired_at is not None
    after = fired_at + downtime
    result = next_occurrence(repeat, anchor, fired, after)
    if result is None:  # `times` is used up: its last occurrence is fired or due by `after`
        assert times is not None
        last_at = occurrence(repeat, anchor, times - 1)
        assert times - 1 <= fired or (last_at is not None and last_at <= after)
        return
    at, k = result
    assert at > after and k > fired and at == occurrence(repeat, anchor, k)
    assert times is None or k < times
    # None skipped that was still ahead: the one before it had fired, or was due by `after`.
    before = occurrence(repeat, anchor, k - 1)
    assert k == fired + 1 or (before is not None and before <= after)


def test_a_series_ends_at_the_last_due_time_every_layer_holds() -> None:
    # 9999-12-31T01:00Z is a datetime here, but not in a zone east of UTC+23h on any consumer,
    # and past LATEST_DUE_AT: the series ends on the range's last instant instead.
    hourly = Repeat("PT1H", None, None)
    anchor = utc(9999, 12, 30, 22)
    assert next_occurrence(hourly, anchor, 1, after=anchor) == (LATEST_DUE_AT, 2)
    assert next_occurrence(hourly, anchor, 2, after=anchor) is None
