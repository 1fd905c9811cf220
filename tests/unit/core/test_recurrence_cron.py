"""Cron schedules (issue 23): the occurrences next_occurrence walks, against an independent
enumeration of the schedule's local minutes placed in the zone.

The oracle shares nothing with worker/core/recurrence.py or cronsim: its own field parser (the
standard syntax: numbers, names, ranges, steps, lists; Vixie cron's rule that day-of-month and
day-of-week are OR-ed unless one starts with `*`), every local minute of every day of the window
checked against it, each match placed with zoneinfo's fold=0 (the documented DST rule), the set
of instants sorted. Days are enumerated, then each day's hour x minute matches: the same set as
stepping minute by minute, a thousand times faster, so a property can span years.
"""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from worker.contract import Repeat
from worker.core import recurrence
from worker.core.recurrence import CRON_MAX_COUNTED, cron_after, next_occurrence, parse_cron

PARIS = ZoneInfo("Europe/Paris")
NEW_YORK = ZoneInfo("America/New_York")
# Half-hour DST (Lord Howe), a southern-hemisphere zone whose changes fall at midnight (Santiago),
# a zone that skipped a whole day (Apia, 2011-12-30), one without DST (Kolkata), and UTC.
ZONES = ["Europe/Paris", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Pacific/Apia",
         "Asia/Kolkata", None]  # fmt: skip

_DAYS = ["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"]
_MONTHS = ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"]
_NAMES = {**{n: i for i, n in enumerate(_DAYS)}, **{n: i + 1 for i, n in enumerate(_MONTHS)}}


def _field(text: str, low: int, high: int) -> set[int]:
    values: set[int] = set()
    for term in text.split(","):
        body, _, step = term.partition("/")
        if body == "*":
            first, last = low, high
        elif "-" in body:
            a, b = body.split("-")
            first, last = _NAMES.get(a) or int(a), _NAMES.get(b) or int(b)
        else:
            first = _NAMES[body] if body in _NAMES else int(body)
            last = high if step else first
        values |= set(range(first, last + 1, int(step or 1)))
    return values


def oracle(expr: str, zone: ZoneInfo | None, start: date, end: date) -> list[datetime]:
    """Every instant of the schedule whose local date is in [start, end), sorted and distinct."""
    minute, hour, dom, month, dow = expr.split()
    minutes, hours = _field(minute, 0, 59), _field(hour, 0, 23)
    doms, months = _field(dom, 1, 31), _field(month, 1, 12)
    dows = {d % 7 for d in _field(dow, 0, 7)}
    day_and = dom.startswith("*") or dow.startswith("*")
    found: set[datetime] = set()
    day = start
    while day < end:
        in_dom, in_dow = day.day in doms, (day.weekday() + 1) % 7 in dows
        if day.month in months and ((in_dom and in_dow) if day_and else (in_dom or in_dow)):
            for h in hours:
                for m in minutes:
                    local = datetime(day.year, day.month, day.day, h, m)
                    # fold=0: a gap's minute takes the offset before the gap, a repeated one its first.
                    at = local.replace(tzinfo=zone or UTC).astimezone(UTC)
                    found.add(at)
        day += timedelta(days=1)
    return sorted(found)


def walk(expr: str, zone: str | None, first: datetime, until: datetime) -> list[datetime]:
    """The occurrences a timer that always fires on time goes through, from `first` (an instant
    of the schedule) up to `until`, by next_occurrence as the firing loop calls it."""
    repeat = Repeat(None, None, zone, cron=expr, until=until)
    seen, index, at = [first], 0, first
    while (nxt := next_occurrence(repeat, first, index, at, fired_at=at)) is not None:
        assert nxt[1] == index + 1
        at, index = nxt
        seen.append(at)
    return seen


def _window(year: int, years: int) -> tuple[date, date, datetime, datetime]:
    start, end = date(year, 1, 1), date(year + years, 1, 1)
    # A day's margin: a local date's instants reach into the next and previous UTC days.
    lo = datetime(year, 1, 2, tzinfo=UTC)
    hi = datetime(year + years, 1, 1, tzinfo=UTC) - timedelta(days=1)
    return start, end, lo, hi


minute_fields = st.sampled_from(["0", "30", "0,30", "15,45", "59", "*/20", "5-10/5", "0-59/30"])
hour_fields = st.sampled_from(["9", "2", "1,2,3", "0", "23", "*/6", "1-3", "2,14", "0-23/8", "12"])
dom_fields = st.sampled_from(["*", "*", "29", "1,15", "31", "28-31", "*/10"])
month_fields = st.sampled_from(["*", "*", "2", "3,10", "JAN-JUN", "*/3", "11"])
dow_fields = st.sampled_from(["*", "*", "MON-FRI", "SUN", "0,6", "7", "SAT"])


@st.composite
def expressions(draw: st.DrawFn) -> str:
    return " ".join(draw(f) for f in (minute_fields, hour_fields, dom_fields, month_fields, dow_fields))


@settings(max_examples=60, deadline=None)
@given(expressions(), st.sampled_from(ZONES), st.integers(2010, 2030))
# Lord Howe springs forward by half an hour (02:00 -> 02:30): 02:20 lands at 02:50, after 02:40.
@example("*/20 2 * * *", "Australia/Lord_Howe", 2027)
@example("30 1,2 * * *", "America/New_York", 2027)
@example("0 9 * * MON-FRI", "Pacific/Apia", 2011)  # Apia skipped Friday 2011-12-30
def test_the_occurrences_walked_are_the_schedule_over_years(expr: str, zone: str | None, year: int) -> None:
    tz = None if zone is None else ZoneInfo(zone)
    start, end, lo, hi = _window(year, 2)
    try:
        parse_cron(expr)
    except ValueError:  # refused only when it can never match (31 February)
        assert oracle(expr, tz, date(2000, 1, 1), date(2029, 1, 1)) == []
        return
    expected = [at for at in oracle(expr, tz, start, end) if lo < at <= hi]
    first = cron_after(expr, tz, lo)
    if not expected:
        assert first is None or first > hi
        return
    assert first == expected[0]
    assert walk(expr, zone, first, hi) == expected


@settings(max_examples=60, deadline=None)
@given(
    expressions(),
    st.sampled_from(ZONES),
    st.integers(2010, 2030),
    st.integers(0, 200),
    st.timedeltas(timedelta(0), timedelta(days=300)),
)
def test_after_downtime_the_next_is_the_first_after_the_reference_and_skipped_ones_count(
    expr: str, zone: str | None, year: int, fired: int, downtime: timedelta
) -> None:
    tz = None if zone is None else ZoneInfo(zone)
    start, end, lo, _ = _window(year, 2)
    schedule = [at for at in oracle(expr, tz, start, end) if at > lo]
    if len(schedule) < 2:
        return
    fired = min(fired, len(schedule) - 2)
    reference = schedule[fired] + downtime
    if reference >= schedule[-1]:
        return
    counted = Repeat(None, 10**6, zone, cron=expr)  # `times` counts the skipped occurrences
    found = next_occurrence(counted, schedule[0], fired, reference, fired_at=schedule[fired])
    expected = next(i for i, at in enumerate(schedule) if at > reference)
    assert found is not None
    assert found[0] == schedule[expected]
    # Every occurrence skipped took its index, up to the documented bound.
    assert found[1] == min(expected, fired + 1 + CRON_MAX_COUNTED)
    # Without `times` nothing counts them: the same next occurrence, the index one on.
    forever = Repeat(None, None, zone, cron=expr)
    found = next_occurrence(forever, schedule[0], fired, reference, fired_at=schedule[fired])
    assert found == (schedule[expected], fired + 1)


@settings(max_examples=40, deadline=None)
@given(expressions(), st.sampled_from(ZONES), st.integers(1, 30), st.integers(0, 40))
def test_times_counts_occurrences_of_the_schedule_including_skipped_ones(
    expr: str, zone: str | None, times: int, skip: int
) -> None:
    tz = None if zone is None else ZoneInfo(zone)
    schedule = [at for at in oracle(expr, tz, date(2027, 1, 1), date(2029, 1, 1)) if at.year >= 2027]
    if len(schedule) < times + 1:
        return
    repeat = Repeat(None, times, zone, cron=expr)
    # Fired the first, then downtime until just before occurrence `skip`.
    reference = schedule[min(skip, len(schedule) - 1)] - timedelta(microseconds=1)
    found = next_occurrence(repeat, schedule[0], 0, reference, fired_at=schedule[0])
    target = max(1, min(skip, len(schedule) - 1))
    assert found == (None if target >= times else (schedule[target], target))


@pytest.mark.parametrize(
    ("zone", "spring", "autumn", "winter_utc", "summer_utc"),
    [
        ("Europe/Paris", date(2027, 3, 28), date(2027, 10, 31), 8, 7),
        ("America/New_York", date(2027, 3, 14), date(2027, 11, 7), 14, 13),
    ],
)
def test_weekday_nine_oclock_across_both_dst_changes_of_2027(
    zone: str, spring: date, autumn: date, winter_utc: int, summer_utc: int
) -> None:
    tz = ZoneInfo(zone)
    first = cron_after("0 9 * * MON-FRI", tz, datetime(2027, 1, 1, tzinfo=UTC))
    assert first is not None
    fired = walk("0 9 * * MON-FRI", zone, first, datetime(2028, 1, 1, tzinfo=UTC))
    assert all(at.astimezone(tz).strftime("%H:%M") == "09:00" for at in fired)
    assert all(at.astimezone(tz).weekday() < 5 for at in fired)
    weekdays = [date(2027, 1, 1) + timedelta(days=d) for d in range(365)]
    assert [at.astimezone(tz).date() for at in fired] == [d for d in weekdays if d.weekday() < 5]
    for at in fired:
        summer = spring <= at.date() < autumn
        assert at.hour == (summer_utc if summer else winter_utc), at


def test_gap_and_fold_minutes_follow_the_every_rules() -> None:
    # 2027-03-14, New York: 02:00 EST jumps to 03:00 EDT. 02:30 does not exist: it takes the
    # offset before the gap (EST), 07:30Z, which is 03:30 EDT.
    assert cron_after("30 2 * * *", NEW_YORK, datetime(2027, 3, 14, 5, tzinfo=UTC)) == datetime(
        2027, 3, 14, 7, 30, tzinfo=UTC
    )
    # A gap minute and the minute it lands on are one occurrence, not two.
    seen = walk("30 2,3 14 3 *", "America/New_York", datetime(2027, 3, 14, 7, 30, tzinfo=UTC),
                datetime(2027, 3, 15, tzinfo=UTC))  # fmt: skip
    assert seen == [datetime(2027, 3, 14, 7, 30, tzinfo=UTC)]
    # The earliest instant wins even when a later local minute (02:20, in the gap) lands after
    # an earlier-looking one (03:15 EDT = 07:15Z): the search looks past the gap minute.
    assert cron_after("15,20 2,3 14 3 *", NEW_YORK, datetime(2027, 3, 14, 6, 50, tzinfo=UTC)) == datetime(
        2027, 3, 14, 7, 15, tzinfo=UTC
    )
    # A reference just past the gap (03:10 EDT = 07:10Z) still sees the day's 02:30, at 07:30Z:
    # the search starts a gap earlier than the reference's local time.
    assert cron_after("30 2 * * *", NEW_YORK, datetime(2027, 3, 14, 7, 10, tzinfo=UTC)) == datetime(
        2027, 3, 14, 7, 30, tzinfo=UTC
    )
    # Half-hour gap (Lord Howe, 2027-10-03, 02:00 -> 02:30 local): 02:20 does not exist and lands
    # at 02:50; 02:40 exists and comes first. 02:30 local is 2027-10-02T15:30Z.
    lord_howe = ZoneInfo("Australia/Lord_Howe")
    at_0230 = datetime(2027, 10, 3, 2, 30, tzinfo=lord_howe).astimezone(UTC)
    assert cron_after("*/20 2 * * *", lord_howe, at_0230) == at_0230 + timedelta(minutes=10)
    # 2027-10-31, Paris: 03:00 CEST falls back to 02:00 CET. 02:30 fires once, at 00:30Z (CEST).
    fall = walk("30 2 * * *", "Europe/Paris", datetime(2027, 10, 30, 0, 30, tzinfo=UTC),
                datetime(2027, 11, 2, tzinfo=UTC))  # fmt: skip
    assert fall == [
        datetime(2027, 10, 30, 0, 30, tzinfo=UTC),
        datetime(2027, 10, 31, 0, 30, tzinfo=UTC),
        datetime(2027, 11, 1, 1, 30, tzinfo=UTC),
    ]


def test_the_29th_of_february_comes_back_every_four_years() -> None:
    first = cron_after("0 12 29 2 *", PARIS, datetime(2025, 1, 1, tzinfo=UTC))
    assert first == datetime(2028, 2, 29, 11, tzinfo=UTC)
    seen = walk("0 12 29 2 *", "Europe/Paris", first, datetime(2041, 1, 1, tzinfo=UTC))
    assert [at.year for at in seen] == [2028, 2032, 2036, 2040]
    assert all(calendar.isleap(at.year) for at in seen)


def test_until_and_times_end_a_cron_schedule() -> None:
    first = datetime(2027, 1, 4, 8, tzinfo=UTC)  # Monday 09:00 Paris
    until = datetime(2027, 1, 8, 8, tzinfo=UTC)  # Friday 09:00 Paris: included
    repeat = Repeat(None, None, "Europe/Paris", cron="0 9 * * MON-FRI", until=until)
    assert len(walk("0 9 * * MON-FRI", "Europe/Paris", first, until)) == 5
    assert next_occurrence(repeat, first, 4, until, fired_at=until) is None
    three = Repeat(None, 3, "Europe/Paris", cron="0 9 * * MON-FRI")
    tuesday, wednesday = first + timedelta(days=1), first + timedelta(days=2)
    assert next_occurrence(three, first, 1, tuesday, fired_at=tuesday) == (wednesday, 2)
    assert next_occurrence(three, first, 2, wednesday, fired_at=wednesday) is None


def test_downtime_longer_than_the_bound_counts_only_the_bound() -> None:
    """The documented cost bound: a minutely schedule down for a day skips 1,439 occurrences;
    the first CRON_MAX_COUNTED take indexes, the rest do not."""
    first = datetime(2027, 1, 1, tzinfo=UTC)
    repeat = Repeat(None, 10**6, None, cron="* * * * *")
    found = next_occurrence(repeat, first, 0, first + timedelta(days=1), fired_at=first)
    assert found == (first + timedelta(days=1, minutes=1), 1 + CRON_MAX_COUNTED)


@pytest.mark.parametrize("zone", ["America/New_York", None])
def test_without_times_decades_of_downtime_cost_two_steps(
    zone: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A minutely schedule due in 1971 and fired now: nothing counts the skipped occurrences, so
    its next one is found in two cron steps, not CRON_MAX_COUNTED (a thousand such rows in one
    claim stalled every replica for tens of seconds)."""
    steps = []

    def counting(*args: object) -> object:
        steps.append(args)
        return cron_after(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(recurrence, "cron_after", counting)
    first = datetime(1971, 1, 1, tzinfo=UTC)
    now = datetime(2026, 11, 27, 12, 0, 30, tzinfo=UTC)
    repeat = Repeat(None, None, zone, cron="* * * * *")
    assert next_occurrence(repeat, first, 0, now, fired_at=first) == (now + timedelta(seconds=30), 1)
    assert len(steps) == 2


@pytest.mark.parametrize(
    ("expr", "why"),
    [
        ("0 9 * *", "five fields"),
        ("0 9 * * * *", "five fields"),  # no seconds field
        ("61 9 * * *", "not a cron expression"),
        ("0 9 * * FUNDAY", "not a cron expression"),
        ("0 9 31 2 *", "not a cron expression"),  # cronsim: day 31 in no February
        ("@daily", "five fields"),
        ("0 9 * * MON\n", "five fields"),
        ("0 " * 70 + "*", "five fields"),
    ],
)
def test_unusable_cron_expressions_say_why(expr: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_cron(expr)
