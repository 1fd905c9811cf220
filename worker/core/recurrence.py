"""Recurring timers: what a period or a cron expression is, and when occurrence k of a timer is due.

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
TIMER_DOWNTIME_AFTER (sql/queries/firing.sql, claim_due). A lease plus a poll interval would do on an
idle fleet, but an overloaded one (a backlog, starved CPU) can be seconds late, and that is not
downtime either. A crash is not downtime, whatever the period: the
occurrences that come due while a dead replica's lease hides the timer, and until a live one
re-claims it, all fire (late, in order), because each keeps the reference of the first claim.

Cron schedules (`repeat.cron`, five fields, parsed and matched by cronsim) are the same rules
over another set of instants. A cron expression names local wall-clock minutes in the zone (UTC
without one); each matching minute is placed in the zone with fold=0, exactly as `every` places
its occurrences, so a minute inside a gap fires shifted forward by the gap and a repeated minute
fires once, at its first instant. The schedule is the sorted set of those instants (two minutes
that land on one instant, a gap's and the hour after it, are one occurrence). The first
occurrence is the first instant at or after dueAt (intake computes it: dueAt is a start, as
EventBridge's StartDate or a NATS schedule's first match); each next one is the first instant
strictly after max(the occurrence that fired, the recurrence reference). Cron occurrences have
no closed form from an index, so the occurrences skipped by downtime are counted one by one, and
only where they count: for `times`. A schedule without `times` goes straight to the first
occurrence after the reference, a few steps whatever the downtime (its index then counts firings).
With `times`, at most CRON_MAX_COUNTED are counted per missed window: past that the count stops
(the index moves on by CRON_MAX_COUNTED), so a capped schedule may end that much later. That is
16 hours of a minutely schedule and 2.7 years of a daily one, and up to ~0.15 s of CPU for one row
(a rare schedule's single step, `0 0 * 2 SUN#5`, up to ~2 ms). A tenant chooses how many rows
cost that, so the firing loop bounds their sum per second too (worker/core/budget.py).

`until` (both kinds) ends a schedule: no occurrence after that instant fires.
"""

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

# Repeat is the contract's (a ScheduleTimer field): the data this arithmetic reads.
from worker.contract import LATEST_DUE_AT, Repeat
from worker.core.domain import Claimed

# Occurrence indexes are stored in a Postgres `integer` column.
MAX_INDEX = 2**31 - 1
# Firing ids carry dueAt in milliseconds, and a sub-second period would be a firehose from one
# row; one second is the shortest period accepted.
MIN_PERIOD = timedelta(seconds=1)
# Nothing longer is meaningful: datetimes end at year 9999.
MAX_MONTHS = 12 * 10_000
MAX_PERIOD_CHARS = 64
_PERIOD_CHARS = re.compile(r"P[0-9A-Za-z.,:-]*\Z", re.ASCII)
# A cron expression: five fields of the characters cron syntax uses (cronsim's: names, L, W, #).
MAX_CRON_CHARS = 120
_CRON_CHARS = re.compile(r"[0-9A-Za-z*/,#-]+(?: +[0-9A-Za-z*/,#-]+){4}\Z", re.ASCII)
# Occurrences of a cron schedule skipped by one downtime that are counted towards `times`
# (module docstring). Each costs a cronsim step, 20 to 150 microseconds.
CRON_MAX_COUNTED = 1000
# A cron expression that matches nothing for this long matches nothing usable (Feb 29 on a
# weekday comes back within 28 years; cronsim itself gives up after 50).
CRON_SEARCH_YEARS = 30
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


@functools.lru_cache(maxsize=4096)
def _cron_template(text: str) -> CronSim:
    return CronSim(text, datetime(2000, 1, 1))


def parse_cron(text: str) -> None:
    """Checks `repeat.cron`; ValueError, with a one-line reason, when it is not usable. Five
    fields (minute hour day-of-month month day-of-week), names (MON, JAN), ranges, steps, lists,
    and cronsim's L, LW, W and #; no seconds field: a schedule's finest step is a minute."""
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
    # A copy of a parsed template: parsing is ~65 us, a step from a given minute 20 to 150 us.
    # cronsim keeps its position in `dt` (naive here: its Debian-cron DST handling applies to
    # aware datetimes only, and the placing in the zone is ours, below).
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
    except (StopIteration, OverflowError):  # nothing for 50 years; past year 9999
        return


def _place(local: datetime, zone: zoneinfo.ZoneInfo | None) -> datetime:
    """A naive local minute as an instant: fold=0, the rule of the module docstring."""
    if zone is None:
        return local.replace(tzinfo=UTC)
    return local.replace(tzinfo=zone).astimezone(UTC)


def _naive(at: datetime, zone: zoneinfo.ZoneInfo | None) -> datetime:
    return at.astimezone(zone or UTC).replace(tzinfo=None)


def cron_after(text: str, zone: zoneinfo.ZoneInfo | None, after: datetime) -> datetime | None:
    """The first instant of the cron schedule strictly after `after` (UTC), or None when there is
    none within CRON_SEARCH_YEARS or before LATEST_DUE_AT.

    Placing with fold=0 is monotonic except in a gap: a gap's minutes land on the hour after it,
    among that hour's own minutes. So the search starts a gap earlier than `after`'s local time
    (the smallest offset of the last two days), and once it finds a gap minute it keeps looking
    among the minutes up to that instant's real local time for an earlier one.
    """
    after = after.astimezone(UTC)
    if zone is None:
        start = after.replace(tzinfo=None)
    else:
        offsets = [(after - timedelta(days=d)).astimezone(zone).utcoffset() for d in (0, 1, 2)]
        start = (after + min(o for o in offsets if o is not None)).replace(tzinfo=None)
    best: datetime | None = None
    horizon: datetime | None = None  # after a gap minute: the naive minute from which none is earlier
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
                horizon = real  # a gap minute lands at `real`; minutes before that, earlier
    except OverflowError:  # the calendar's end
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
    """Occurrence k (0 = the anchor) of an `every` schedule in UTC, or None when it lies beyond
    LATEST_DUE_AT."""
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
    repeat: Repeat, anchor: datetime, fired_index: int, after: datetime, *, fired_at: datetime | None = None
) -> tuple[datetime, int] | None:
    """The next occurrence strictly after `after`, given that occurrence number `fired_index`
    (0-based, counted from `anchor`, the first occurrence) has just fired, due at `fired_at`
    (needed for a cron schedule; an `every` one computes it from the anchor). Returns
    (due_at_utc, its index) or None when `times` is used up, `until` passed (or the schedule runs
    past LATEST_DUE_AT, or past MAX_INDEX). Occurrences due at or before `after` are skipped and
    consume their indexes (a cron schedule's only where `times` counts them)."""
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
        # Nothing counts the skipped ones: straight past them, in a few steps whatever the downtime.
        nxt = cron_after(repeat.cron, zone, after)
    counted = 0
    # Each occurrence due at or before `after` was skipped (downtime) and takes an index.
    while nxt is not None and nxt <= after:
        if index >= last:  # `times` used up by the skipped ones
            return None
        if counted == CRON_MAX_COUNTED:  # the bound (module docstring): the rest are not counted
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


def next_of(timer: Claimed) -> tuple[datetime | None, int | None]:
    """The occurrence after this one, for a recurring timer; (None, None) when it was the last.

    The first due after the timer's recurrence reference (the claimed_at column): one that came
    due during downtime is skipped, one that came due while a crashed replica's lease ran out is
    not (it fires, late; claim_due).
    """
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
