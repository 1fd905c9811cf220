"""The CPU one accepted command can make a replica spend, for the costliest schedules a tenant may choose."""

from __future__ import annotations

import json
import sys
import timeit
from datetime import UTC, datetime, timedelta
from typing import Any

from tools.bench.report import around_loop, lines, parse, parser
from worker.contract import Rejection, ScheduleTimer
from worker.core.commands import parse_command
from worker.core.domain import Claimed
from worker.core.fireable import NEXT_FREE_S, NEXT_SHARE
from worker.core.recurrence import next_of

PROG = "python -m tools.bench.tenantwork"
NOW = datetime(2026, 11, 27, 12, 0, 30, tzinfo=UTC)
LONG_AGO = "1971-01-01T00:00:00Z"
# The costliest schedules known, each overdue since 1971 (the first four) or just due.
CASES: dict[str, dict[str, Any]] = {
    "cron_minutely_zone": {"cron": "* * * * *", "timezone": "America/New_York"},
    "cron_minutely_times": {"cron": "* * * * *", "timezone": "America/New_York", "times": 1_000_000},
    "cron_daily_times": {"cron": "0 9 * * *", "timezone": "Europe/Paris", "times": 1_000_000},
    "every_second_times": {"every": "PT1S", "times": 2_000_000_000},
    "cron_once_in_decades": {"cron": "59 23 * 2 SAT#5"},
    "every_month_zone": {"every": "P1M", "timezone": "Pacific/Apia"},
}


def _parse(body: bytes) -> ScheduleTimer:
    parsed = parse_command("schedule", "acme", body, now=NOW, max_horizon=timedelta(days=36500))
    if isinstance(parsed, Rejection) or not isinstance(parsed, ScheduleTimer):
        raise SystemExit(f"{PROG}: a case was refused: {parsed}")
    return parsed


def claimed(timer: ScheduleTimer) -> Claimed:
    """The row as a claim returns it after downtime: its first occurrence, the reference now."""
    r = timer.repeat
    assert r is not None
    return Claimed(
        timer.tenant_id, timer.service_call_id, timer.due_at, None, 1, 1, r.every, r.times, r.timezone,
        timer.due_at, 0, NOW, "(0,1)", repeat_cron=r.cron, repeat_until=r.until,
    )  # fmt: skip


def measure(repeat: int) -> dict[str, float]:
    """Best-of-`repeat` microseconds per row of each case: at intake, and to fire."""
    out: dict[str, float] = {}
    for name, spec in CASES.items():
        body = json.dumps(
            {"tenantId": "acme", "serviceCallId": "x" * 64, "dueAt": LONG_AGO, "repeat": spec}
        ).encode()
        row = claimed(_parse(body))
        for stage, fn in (("intake", lambda b=body: _parse(b)), ("next", lambda r=row: next_of(r))):
            out[f"{name}_{stage}_us"] = round(min(timeit.repeat(fn, number=20, repeat=repeat)) / 20 * 1e6, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(PROG, __doc__, {"repeat": (5, "rounds; the best counts")})
    if (args := parse(p, argv)) is None:
        return 2
    report: dict[str, Any] = {"rounds": args.repeat, **around_loop(lambda: measure(args.repeat))}
    for stage in ("next", "intake"):
        report[f"worst_{stage}_us"] = max(v for k, v in report.items() if k.endswith(f"_{stage}_us"))
    # the firing loop's budget: what such rows may take of each second, and one row beyond it
    report |= {"next_budget_share": NEXT_SHARE, "next_free_us": NEXT_FREE_S * 1e6}
    print(json.dumps(report, indent=2) if args.json else lines(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
