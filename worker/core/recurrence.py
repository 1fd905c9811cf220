"""Recurring timers: what a period is, and when occurrence k of a timer is due.

Occurrence k is `anchor + k * every`, always computed from the anchor (the first dueAt), never
by stepping from the previous occurrence: stepping would let a clamped day stick, so that
Jan 31 + P1M gave Feb 28, Mar 28, Apr 28 ... Anchored, a month step clamps to the last day of
the target month only for that occurrence: Jan 31 -> Feb 28 -> Mar 31 -> Apr 30, and Feb 29 +
P1Y -> Feb 28 2025, 2026, 2027 -> Feb 29 2028.

Without a timezone the arithmetic is done in UTC (PT1H is exactly one hour of elapsed time).
With a timezone it is wall-clock arithmetic in that zone: the anchor is turned into local time,
k * every is added to the naive local time, and the result is placed back in the zone. So
"09:00 every day" stays 09:00 local across daylight-saving changes. Local times the zone skips
or repeats are placed with fold=0 (PEP 495), which zoneinfo maps as follows:

- a time that does not exist (spring forward, 02:30 on 2026-03-08 in New York) takes the offset
  in force before the gap, so it fires shifted forward by the gap: 02:30 EST = 03:30 EDT = 07:30Z;
- a time that exists twice (fall back, 01:30 on 2026-11-01 in New York) fires once, at the first
  (daylight-time) instant: 01:30 EDT = 05:30Z.

Wall-clock arithmetic applies to every period once a timezone is given, so an hourly timer with
a timezone skips the repeated hour on fall-back day (01:30 EDT, then 02:30 EST). Periods shorter
than a daylight-saving gap fold the occurrences inside the gap onto the hour after it.

After downtime, a recurring timer fires once for the missed window, not once per missed
occurrence: the occurrence that was due fires (late), and the next one is the first that is due
strictly after the firing's claim. The occurrences skipped in between still consume their
indexes, so `times` counts occurrences of the schedule, not firings: `times=3` with the second one
missed fires the first and the third, then ends.

Downtime means no replica claimed the timer although it could: it sat claimable for longer than
TIMER_DOWNTIME_AFTER (sql/queries.sql, claim_due). A lease plus a poll interval would do on an
idle fleet, but an overloaded one (a backlog, starved CPU) can be seconds late, and that is not
downtime either. A crash is not downtime, whatever the period: the
occurrences that come due while a dead replica's lease hides the timer, and until a live one
re-claims it, all fire (late, in order), because each keeps the reference of the first claim.
"""

from __future__ import annotations

import calendar
import decimal
import functools
import re
import zoneinfo
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import isodate

# Repeat is the contract's (a ScheduleTimer field): the data this arithmetic reads.
from worker.contract import LATEST_DUE_AT, Repeat

# Occurrence indexes are stored in a Postgres `integer` column.
MAX_INDEX = 2**31 - 1
# Firing ids carry dueAt in milliseconds, and a sub-second period would be a firehose from one
# row; one second is the shortest period accepted.
MIN_PERIOD = timedelta(seconds=1)
# Nothing longer is meaningful: datetimes end at year 9999.
MAX_MONTHS = 12 * 10_000
MAX_PERIOD_CHARS = 64
_PERIOD_CHARS = re.compile(r"P[0-9A-Za-z.,:-]*\Z", re.ASCII)
# IANA names are ASCII words joined by "/"; no dots, so no "..", no "zone.tab", no absolute paths.
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]{1,40}(?:/[A-Za-z0-9_+-]{1,40}){0,3}\Z", re.ASCII)
# In the zone database directory, but the machine's own zone, not an IANA name.
_NOT_ZONES = frozenset({"localtime", "posixrules"})


@dataclass(frozen=True, slots=True)
class Period:
    """An ISO 8601 duration split into what calendars disagree on (months) and what they don't."""

    months: int
    delta: timedelta


def parse_period(text: str) -> Period:
    """The period of `repeat.every`; ValueError, with a one-line reason, when it is not usable."""
    if len(text) > MAX_PERIOD_CHARS or not _PERIOD_CHARS.match(text):
        raise ValueError("every must be an ISO 8601 duration such as PT1H, P1D, P1M or P1Y")
    try:
        parsed = isodate.parse_duration(text)
    except (isodate.ISO8601Error, ValueError, OverflowError, decimal.InvalidOperation) as exc:
        raise ValueError(f"every is not an ISO 8601 duration: {exc}") from None
    if isinstance(parsed, timedelta):
        period = Period(0, parsed)
    else:  # isodate.Duration: Decimal years and months, plus a timedelta
        years, months = parsed.years, parsed.months
        if years != int(years) or months != int(months):
            raise ValueError("every may not hold fractional years or months")
        period = Period(int(years) * 12 + int(months), parsed.tdelta)
    if period.months < 0 or period.delta < timedelta(0):
        raise ValueError("every must be positive")
    if period.months == 0 and period.delta < MIN_PERIOD:
        raise ValueError(f"every must be at least {MIN_PERIOD.total_seconds():g} second")
    if period.months > MAX_MONTHS:
        raise ValueError("every is longer than the calendar")
    return period


@functools.cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) - _NOT_ZONES


def load_zone(name: str) -> zoneinfo.ZoneInfo | None:
    """The zone of an IANA name, or None for anything else (checked against the zone list, so a
    hostile name never reaches the filesystem)."""
    if not _ZONE_NAME.match(name) or name not in _known_zones():
        return None
    return zoneinfo.ZoneInfo(name)


def _add_months(when: datetime, months: int) -> datetime:
    """Calendar months later, the day clamped to the target month's last day."""
    carry, month0 = divmod(when.month - 1 + months, 12)
    year = when.year + carry
    if year > 9999:
        raise OverflowError("date value out of range")
    day = min(when.day, calendar.monthrange(year, month0 + 1)[1])
    return when.replace(year=year, month=month0 + 1, day=day)


def _step(start: datetime, period: Period, k: int) -> datetime:
    return _add_months(start, period.months * k) + period.delta * k


def occurrence(repeat: Repeat, anchor: datetime, k: int) -> datetime | None:
    """Occurrence k (0 = the anchor) in UTC, or None when it lies beyond LATEST_DUE_AT."""
    period = parse_period(repeat.every)
    zone = _zone_of(repeat)
    return _occurrence(period, zone, anchor, k)


def _occurrence(period: Period, zone: zoneinfo.ZoneInfo | None, anchor: datetime, k: int) -> datetime | None:
    try:
        if zone is None:
            at = _step(anchor.astimezone(UTC), period, k)
        else:
            local = anchor.astimezone(zone).replace(tzinfo=None)
            # replace(tzinfo=zone) leaves fold=0: the module docstring says what that means.
            at = _step(local, period, k).replace(tzinfo=zone).astimezone(UTC)
    except OverflowError:  # beyond the calendar (timedelta * k too, for huge k)
        return None
    return at if at <= LATEST_DUE_AT else None


def _zone_of(repeat: Repeat) -> zoneinfo.ZoneInfo | None:
    if repeat.timezone is None:
        return None
    zone = load_zone(repeat.timezone)
    if zone is None:  # validated at intake; only a tzdata downgrade could bring this here
        raise ValueError(f"unknown timezone {repeat.timezone!a}")
    return zone


def next_occurrence(
    repeat: Repeat, anchor: datetime, fired_index: int, after: datetime
) -> tuple[datetime, int] | None:
    """The next occurrence strictly after `after`, given that occurrence number `fired_index`
    (0-based, counted from `anchor`, the first dueAt) has just fired. Returns (due_at_utc, its
    index) or None when `times` is used up (or the schedule runs past LATEST_DUE_AT, or past
    MAX_INDEX). Occurrences due at or before `after` are skipped and consume their indexes."""
    period = parse_period(repeat.every)
    zone = _zone_of(repeat)
    last = MAX_INDEX if repeat.times is None else min(repeat.times - 1, MAX_INDEX)

    def due_after(k: int) -> bool:
        at = _occurrence(period, zone, anchor, k)
        return at is None or at > after  # past the calendar counts as "after": it ends the search

    # Occurrences grow with k, so search: gallop to an index due after `after`, then bisect.
    # Years of downtime on a one-second period cost about 60 evaluations, not millions.
    lo = fired_index + 1  # every index in [fired_index + 1, lo) is due at or before `after`
    if lo > last:
        return None
    hi, stride = lo, 1
    while not due_after(hi):
        if hi >= last:
            return None
        lo, stride = hi + 1, stride * 2
        hi = min(hi + stride, last)
    while lo < hi:
        mid = (lo + hi) // 2
        if due_after(mid):
            hi = mid
        else:
            lo = mid + 1
    at = _occurrence(period, zone, anchor, hi)
    return None if at is None else (at, hi)
