"""The CPU that one accepted command can make a replica spend, for the costliest inputs a tenant may
choose: checking the ScheduleTimer at intake, and computing its next occurrence when it fires after
decades overdue. Each is bounded per row (worker/core/recurrence.py); the firing loop also bounds
their sum per second (worker/core/budget.py) and intake hands the event loop back between them
(worker/core/waiting.py, Slices), so this says how long one row holds the loop at most.

    python -m tools.bench.tenantwork              # best of 5 rounds, each case's microseconds per row
    python -m tools.bench.tenantwork --json

Pure CPU in one process: the best of several rounds is the round least disturbed by the machine.
The calibration loop (calibrate.py) is printed beside the figures, as everywhere in tools/bench.
"""

from __future__ import annotations

import argparse
import json
import sys
import timeit
from datetime import UTC, datetime, timedelta
from typing import Any

from tools.bench.calibrate import cpu_loop_ms
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
    p = argparse.ArgumentParser(prog=PROG, description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=5, help="rounds; the best counts (default 5)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.repeat < 1:
        print(f"{PROG}: --repeat must be at least 1", file=sys.stderr)
        return 2
    calibration = [cpu_loop_ms()]
    result = measure(args.repeat)
    calibration.append(cpu_loop_ms())
    worst_next = max(v for k, v in result.items() if k.endswith("_next_us"))
    report = {
        "rounds": args.repeat,
        "cpu_loop_ms": calibration,
        **result,
        "worst_next_us": worst_next,
        "worst_intake_us": max(v for k, v in result.items() if k.endswith("_intake_us")),
        # The firing loop's budget: what such rows may take of each second, and one row beyond it.
        "next_budget_share": NEXT_SHARE,
        "next_free_us": NEXT_FREE_S * 1e6,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        loops = f"cpu loop {calibration[0]:.0f} / {calibration[1]:.0f} ms"
        print(f"{PROG}: best of {args.repeat} rounds; {loops}")
        for k, v in report.items():
            if k.endswith("_us"):
                print(f"  {k}: {v:,.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
