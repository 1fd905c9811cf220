"""The benchmark scenarios of docs/BENCHMARKS.md, several runs, medians and ranges.

They live in the repository, not in the package: run them from a checkout with `make bench`,
`python -m tools.bench` or `timer-service bench` (which hands its arguments over to `main`). They
drive the service through `worker.devkit` (embedded servers, replicas as processes, the recorder),
which ships with the package for `timer-service dev`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench.calibrate import calibrate, describe
from tools.bench.context import Context, Metrics
from tools.bench.rig import machine
from tools.bench.scenarios import SCENARIOS, Scenario
from worker.errors import ConfigError
from worker.logs import redact

MODULE_PROG = "python -m tools.bench"
MAX_SOAK_RATE = 20_000  # ScheduleTimer commands a second: well past what one machine's fleet takes


def main(argv: list[str] | None = None, prog: str = MODULE_PROG) -> int:
    """Parse `argv` (default: this process's arguments) and run the scenarios; the exit status."""
    given = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog=prog, description=(__doc__ or "").split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args(given)
    try:
        return run_bench(args, invocation(prog, MODULE_PROG, "bench", given))
    except ConfigError as exc:  # no embedded extra and no URLs given: one line, as the CLI says it
        print(f"{prog}: {redact(str(exc))}", file=sys.stderr)
        return 2


# TIMER_* variables the bench's replicas inherit that are not a setting of the run (where the
# servers are, credentials): left out of the command a report names.
_NOT_A_SETTING = re.compile(r"URL|SECRET|PASSWORD|SEED|CREDS|TOKEN|KEY|_FILE$")


def invocation(prog: str, module_prog: str, make_target: str, argv: list[str]) -> str:
    """The command a report names, as it was typed: `make <target> ARGS=...` when make ran the
    module, after the TIMER_* settings the replicas inherit from this environment (a run with
    TIMER_EVENTS_FAST_INGEST=on is another configuration, and its report says so)."""
    given = shlex.join(argv)
    settings = " ".join(
        f"{k}={shlex.quote(v)}"
        for k, v in sorted(os.environ.items())
        if k.startswith("TIMER_") and not _NOT_A_SETTING.search(k)
    )
    if prog == module_prog and os.environ.get("MAKELEVEL"):
        command = f"make {make_target}" + (f" ARGS={shlex.quote(given)}" if given else "")
    else:
        command = f"{prog} {given}".rstrip()
    return f"{settings} {command}".lstrip()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "scenarios",
        nargs="*",
        metavar="SCENARIO",
        help=f"scenarios to run (default: all): {', '.join(SCENARIOS)}",
    )
    p.add_argument("--runs", type=int, default=3, help="runs of each scenario (default 3)")
    p.add_argument("--replicas", type=int, default=3, help="replica processes (default 3)")
    p.add_argument(
        "--scale", type=float, default=1.0, help="multiply every size by this (0.01 for a quick smoke run)"
    )
    p.add_argument(
        "--sync-always",
        action="store_true",
        help="embedded NATS fsyncs every JetStream write (sync_interval: always)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument(
        "--vacuum-cost-delay-ms",
        type=_cost_delay,
        metavar="MS",
        help="soak only: set autovacuum_vacuum_cost_delay of `timers` to MS (0 to 100) before the load"
        " (default: as the migrations set it, 5)",
    )
    p.add_argument(
        "--soak-rate",
        type=_soak_rate,
        metavar="N",
        help=f"soak only: schedule N timers a second (1 to {MAX_SOAK_RATE:,}) and cancel a tenth as"
        " many (default 500)",
    )


def _cost_delay(text: str) -> float:
    """Postgres' range for the table's autovacuum_vacuum_cost_delay, checked before any server runs."""
    try:
        ms = float(text)
    except ValueError:
        ms = math.nan
    if not 0 <= ms <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds from 0 to 100")
    return ms


def _soak_rate(text: str) -> int:
    try:
        rate = int(text)
    except ValueError:
        rate = 0
    if not 1 <= rate <= MAX_SOAK_RATE:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a whole number of timers a second from 1 to {MAX_SOAK_RATE:,}"
        )
    return rate


def default_scenarios() -> list[str]:
    """What `bench` runs unnamed: every scenario with a target; `sweep` (lateness against load, no
    target) and `soak` (a quarter of an hour a run) only when named."""
    return [n for n, s in SCENARIOS.items() if s.targets and not s.on_request]


def run_bench(args: argparse.Namespace, command: str) -> int:
    from worker.devkit.dev import servers  # the same embedded servers, or TIMER_DATABASE_URL / TIMER_NATS_URL

    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        print(f"unknown scenario: {', '.join(unknown)} (known: {', '.join(SCENARIOS)})", file=sys.stderr)
        return 2
    chosen = [SCENARIOS[s] for s in args.scenarios or default_scenarios()]
    for flag, given in (
        ("--vacuum-cost-delay-ms", args.vacuum_cost_delay_ms),
        ("--soak-rate", args.soak_rate),
    ):
        if given is not None and SCENARIOS["soak"] not in chosen:
            print(f"{flag} applies to the soak only: name `soak` with it", file=sys.stderr)
            return 2
    with (
        tempfile.TemporaryDirectory(prefix="timer-bench-") as tmp,
        servers(Path(tmp), sync_always=args.sync_always) as (db_url, nats_url),
    ):
        # Before and after: the machine's speed beside the figures, and whether it moved meanwhile.
        calibration = [calibrate(Path(tmp))]
        results: dict[str, Any] = {}
        for scenario in chosen:
            runs: list[Metrics] = []
            for i in range(args.runs):

                def progress(msg: str, name: str = scenario.name, run: int = i + 1) -> None:
                    print(f"[{name} {run}/{args.runs}] {msg}", file=sys.stderr, flush=True)

                ctx = Context(
                    db_url,
                    nats_url,
                    Path(tmp),
                    args.replicas,
                    args.scale,
                    progress,
                    args.vacuum_cost_delay_ms,
                    args.soak_rate,
                )
                started = time.monotonic()
                try:
                    runs.append(asyncio.run(_run(scenario, ctx)))
                except RuntimeError as exc:  # a scenario that could not finish says why, in one line
                    print(f"bench {scenario.name}: {exc}", file=sys.stderr)
                    return 1
                progress(f"done in {time.monotonic() - started:.0f}s: {_brief(runs[-1])}")
            results[scenario.name] = {
                "runs": runs,
                "median": _median(runs),
                "targets": _verdicts(scenario, runs),
            }
        calibration.append(calibrate(Path(tmp)))
    report = {
        "command": command,
        "machine": machine(),
        "calibration": calibration,
        "nats_sync": "always" if args.sync_always else "default",
        "replicas": args.replicas,
        "results": results,
    }
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


async def _run(scenario: Scenario, ctx: Context) -> Metrics:
    return await scenario.run(ctx)


def _median(runs: list[Metrics]) -> Metrics:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def _verdicts(scenario: Scenario, runs: list[Metrics]) -> list[dict[str, Any]]:
    out = []
    for metric, op, target in scenario.targets:
        value = statistics.median(r[metric] for r in runs)
        met = value >= target if op == ">=" else value <= target
        out.append({"metric": metric, "op": op, "target": target, "median": value, "met": met})
    return out


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}" if x == x else "n/a"


def _brief(m: Metrics) -> str:
    return " ".join(f"{k}={_fmt(v)}" for k, v in m.items())


def table(report: dict[str, Any]) -> str:
    """A Markdown table: one row per target, with the median and the range over the runs."""
    lines = [
        f"{report['command']}  (nats sync: {report['nats_sync']}, {report['replicas']} replicas)",
        *(describe(c) for c in report.get("calibration", [])),
        "",
        "| scenario | metric | median | min .. max | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for name, res in report["results"].items():
        for v in res["targets"]:
            values = [r[v["metric"]] for r in res["runs"]]
            spread = f"{_fmt(min(values))} .. {_fmt(max(values))}"
            lines.append(
                f"| {name} | {v['metric']} | {_fmt(v['median'])} | {spread} "
                f"| {v['op']} {_fmt(v['target'])} | {'yes' if v['met'] else 'NO'} |"
            )
    lines.append("")
    for name, res in report["results"].items():
        lines.append(f"{name}: {_brief(res['median'])}")
    return "\n".join(lines)
