"""Recurring timers: a period or a cron expression, and when occurrence k of a timer is due.

Occurrence k is computed from the anchor, never stepped from the previous one, so a clamped day does
not stick (Jan 31 + P1M: Feb 28, Mar 31). With a timezone the arithmetic is wall-clock, placed with
fold=0: a skipped time fires shifted by the gap, a repeated one once.

After downtime a timer fires once for the missed window; skipped occurrences still take indexes, so
`times` counts the schedule's occurrences. Cron has no closed form, so skipped occurrences are
counted one by one, only for `times`, at most CRON_MAX_COUNTED per window."""

from __future__ import annotations

import calendar
import copy
import decimal
import functools
import re
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import isodate
from cronsim import CronSim, CronSimError

from worker.contract import LATEST_DUE_AT, Repeat
from worker.core.domain import Claimed

# Occurrence indexes are stored in a Postgres `integer` column.
MAX_INDEX = 2**31 - 1
# One second is the shortest period: firing ids carry dueAt in milliseconds.
MIN_PERIOD = timedelta(seconds=1)
# Nothing longer is meaningful: datetimes end at year 9999.
MAX_MONTHS = 12 * 10_000
MAX_PERIOD_CHARS = 64
_PERIOD_CHARS = re.compile(r"P[0-9A-Za-z.,:-]*\Z", re.ASCII)
MAX_CRON_CHARS = 120
_CRON_CHARS = re.compile(r"[0-9A-Za-z*/,#-]+(?: +[0-9A-Za-z*/,#-]+){4}\Z", re.ASCII)
# Skipped cron occurrences counted towards `times` per downtime; each costs a cronsim step.
CRON_MAX_COUNTED = 1000
# A cron expression that matches nothing for this long matches nothing usable.
CRON_SEARCH_YEARS = 30
# No dots in a name, so no "..", no "zone.tab", no absolute paths.
_ZONE_NAME = re.compile(r"[A-Za-z0-9_+-]{1,40}(?:/[A-Za-z0-9_+-]{1,40}){0,3}\Z", re.ASCII)
# In the zone directory, but not IANA names.
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
    else:
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


@functools.lru_cache(maxsize=4096)
def _cron_template(text: str) -> CronSim:
    return CronSim(text, datetime(2000, 1, 1))


def parse_cron(text: str) -> None:
    """Checks `repeat.cron`; ValueError, with a one-line reason, when it is not usable."""
    if len(text) > MAX_CRON_CHARS or not _CRON_CHARS.match(text):
        raise ValueError(
            "cron must be five fields, minute hour day-of-month month day-of-week (0 9 * * MON-FRI)"
        )
    try:
        _cron_template(text)
    except (CronSimError, ValueError, IndexError) as exc:
        raise ValueError(f"cron is not a cron expression: {exc}") from None


def _cron_minutes(text: str, start: datetime) -> Iterator[datetime]:
    """The matching local minutes (naive) strictly after the naive `start`, in order."""
    # A copy of a parsed template, as parsing costs more than a step. Naive: the zone placing is ours.
    it = copy.copy(_cron_template(text))
    it.dt = start.replace(second=0, microsecond=0)
    it.skip_initial_tick = False
    limit = start.year + CRON_SEARCH_YEARS
    try:
        while True:
            minute = next(it)
            if minute.year > limit:
                return
            yield minute
    except (StopIteration, OverflowError):
        return


def _place(local: datetime, zone: zoneinfo.ZoneInfo | None) -> datetime:
    if zone is None:
        return local.replace(tzinfo=UTC)
    return local.replace(tzinfo=zone).astimezone(UTC)


def _naive(at: datetime, zone: zoneinfo.ZoneInfo | None) -> datetime:
    return at.astimezone(zone or UTC).replace(tzinfo=None)


def cron_after(text: str, zone: zoneinfo.ZoneInfo | None, after: datetime) -> datetime | None:
    """The first instant of the cron schedule strictly after `after`, or None. A gap's minutes land on
    the hour after it, so the search starts a gap early and looks on for an earlier gap minute."""
    after = after.astimezone(UTC)
    if zone is None:
        start = after.replace(tzinfo=None)
    else:
        offsets = [(after - timedelta(days=d)).astimezone(zone).utcoffset() for d in (0, 1, 2)]
        start = (after + min(o for o in offsets if o is not None)).replace(tzinfo=None)
    best: datetime | None = None
    horizon: datetime | None = None
    try:
        for local in _cron_minutes(text, start - timedelta(minutes=1)):
            if horizon is not None and local >= horizon:
                break
            at = _place(local, zone)
            if at <= after:
                continue
            best = at if best is None else min(best, at)
            if horizon is None:
                real = _naive(at, zone)
                if real == local:  # not in a gap: every later minute lands later
                    break
                horizon = real
    except OverflowError:
        pass
    return best if best is not None and best <= LATEST_DUE_AT else None


def first_cron_occurrence(repeat: Repeat, due_at: datetime) -> datetime | None:
    """A cron timer's first occurrence: the first instant of its schedule at or after dueAt."""
    if repeat.cron is None:
        raise ValueError("not a cron schedule")
    return cron_after(repeat.cron, _zone_of(repeat), due_at - timedelta(microseconds=1))


@functools.cache
def _known_zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones()) - _NOT_ZONES


def load_zone(name: str) -> zoneinfo.ZoneInfo | None:
    """The zone of an IANA name, or None; checked against the zone list, so no name reaches the
    filesystem."""
    if not _ZONE_NAME.match(name) or name not in _known_zones():
        return None
    return zoneinfo.ZoneInfo(name)


def _add_months(when: datetime, months: int) -> datetime:
    carry, month0 = divmod(when.month - 1 + months, 12)
    year = when.year + carry
    if year > 9999:
        raise OverflowError("date value out of range")
    day = min(when.day, calendar.monthrange(year, month0 + 1)[1])
    return when.replace(year=year, month=month0 + 1, day=day)


def _step(start: datetime, period: Period, k: int) -> datetime:
    return _add_months(start, period.months * k) + period.delta * k


def occurrence(repeat: Repeat, anchor: datetime, k: int) -> datetime | None:
    """Occurrence k (0 = the anchor) of an `every` schedule, or None beyond LATEST_DUE_AT."""
    if repeat.every is None:
        raise ValueError("occurrence k has a closed form for `every` schedules only")
    period = parse_period(repeat.every)
    zone = _zone_of(repeat)
    return _occurrence(period, zone, anchor, k)


def _occurrence(period: Period, zone: zoneinfo.ZoneInfo | None, anchor: datetime, k: int) -> datetime | None:
    try:
        if zone is None:
            at = _step(anchor.astimezone(UTC), period, k)
        else:
            local = anchor.astimezone(zone).replace(tzinfo=None)
            at = _step(local, period, k).replace(tzinfo=zone).astimezone(UTC)
    except OverflowError:
        return None
    return at if at <= LATEST_DUE_AT else None


def _zone_of(repeat: Repeat) -> zoneinfo.ZoneInfo | None:
    if repeat.timezone is None:
        return None
    zone = load_zone(repeat.timezone)
    if zone is None:
        raise ValueError(f"unknown timezone {repeat.timezone!a}")
    return zone


def next_occurrence(
    repeat: Repeat, anchor: datetime, fired_index: int, after: datetime, *, fired_at: datetime | None = None
) -> tuple[datetime, int] | None:
    """The next occurrence strictly after `after`, with its index, once occurrence `fired_index` fired
    at `fired_at`; None when the schedule ended. Occurrences due by `after` are skipped but take
    indexes."""
    last = MAX_INDEX if repeat.times is None else min(repeat.times - 1, MAX_INDEX)
    if repeat.cron is not None:
        found = _next_cron(repeat, fired_index, fired_at or anchor, after, last)
    else:
        found = _next_every(repeat, anchor, fired_index, after, last)
    if found is None or (repeat.until is not None and found[0] > repeat.until):
        return None
    return found


def _next_cron(
    repeat: Repeat, fired_index: int, fired_at: datetime, after: datetime, last: int
) -> tuple[datetime, int] | None:
    assert repeat.cron is not None
    zone = _zone_of(repeat)
    index = fired_index + 1
    nxt = cron_after(repeat.cron, zone, fired_at)
    if repeat.times is None and nxt is not None and nxt <= after:
        nxt = cron_after(repeat.cron, zone, after)
    counted = 0
    while nxt is not None and nxt <= after:
        if index >= last:
            return None
        if counted == CRON_MAX_COUNTED:
            nxt = cron_after(repeat.cron, zone, after)
            break
        if repeat.until is not None and nxt > repeat.until:
            return None
        index, counted = index + 1, counted + 1
        nxt = cron_after(repeat.cron, zone, nxt)
    if nxt is None or index > last:
        return None
    return nxt, index


def _next_every(
    repeat: Repeat, anchor: datetime, fired_index: int, after: datetime, last: int
) -> tuple[datetime, int] | None:
    if repeat.every is None:
        raise ValueError("a repeat needs every or cron")
    period = parse_period(repeat.every)
    zone = _zone_of(repeat)

    def due_after(k: int) -> bool:
        at = _occurrence(period, zone, anchor, k)
        return at is None or at > after  # past the calendar counts as "after": it ends the search

    # Occurrences grow with k: gallop, then bisect, so years of downtime cost a few dozen evaluations.
    lo = fired_index + 1
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


def next_of(timer: Claimed) -> tuple[datetime | None, int | None]:
    """The occurrence after this one, for a recurring timer; (None, None) when it was the last."""
    if (timer.repeat_every is None and timer.repeat_cron is None) or timer.anchor_due_at is None:
        return None, None
    repeat = Repeat(
        timer.repeat_every,
        timer.repeat_times,
        timer.repeat_timezone,
        cron=timer.repeat_cron,
        until=timer.repeat_until,
    )
    nxt = next_occurrence(
        repeat,
        timer.anchor_due_at,
        timer.occurrence_index,
        timer.recurrence_ref,
        fired_at=timer.due_at if timer.nominal_due_at is None else timer.nominal_due_at,
    )
    return (nxt[0], nxt[1]) if nxt else (None, None)
