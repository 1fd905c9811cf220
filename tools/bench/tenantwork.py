"""The CPU one accepted command can make a replica spend, for the costliest schedules a tenant may
choose: checking it at intake, and its next occurrence when it fires decades overdue (how long one
row holds the event loop at most); the best of several rounds."""

from __future__ import annotations

import json
import sys
import timeit
from datetime import UTC, datetime, timedelta
from typing import Any

from tools.bench.report import around_loop, parser, positive
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


def command(repeat: dict[str, Any]) -> bytes:
    body = {"tenantId": "acme", "serviceCallId": "x" * 64, "dueAt": LONG_AGO, "repeat": repeat}
    return json.dumps(body).encode()


def parse(body: bytes) -> ScheduleTimer:
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
        body = command(spec)
        row = claimed(parse(body))
        for stage, fn in (("intake", lambda b=body: parse(b)), ("next", lambda r=row: next_of(r))):
            number = 20
            best = min(timeit.repeat(fn, number=number, repeat=repeat))
            out[f"{name}_{stage}_us"] = round(best / number * 1e6, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    p = parser(PROG, __doc__)
    p.add_argument("--repeat", type=int, default=5, help="rounds; the best counts (default 5)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not positive(PROG, args, "--repeat"):
        return 2
    report: dict[str, Any] = {"rounds": args.repeat, **around_loop(lambda: measure(args.repeat))}
    for stage in ("next", "intake"):
        report[f"worst_{stage}_us"] = max(v for k, v in report.items() if k.endswith(f"_{stage}_us"))
    # the firing loop's budget: what such rows may take of each second, and one row beyond it
    report |= {"next_budget_share": NEXT_SHARE, "next_free_us": NEXT_FREE_S * 1e6}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        loops = f"cpu loop {report['cpu_loop_ms'][0]:.0f} / {report['cpu_loop_ms'][1]:.0f} ms"
        print(f"{PROG}: best of {args.repeat} rounds; {loops}")
        for k, v in report.items():
            if k.endswith("_us"):
                print(f"  {k}: {v:,.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
