"""The benchmark scenarios of docs/BENCHMARKS.md, several runs, medians and ranges.

From a checkout: `make bench`, `python -m tools.bench` or `timer-service bench` (which hands its
arguments to `main`); they drive the service through `worker.devkit`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from typing import Any

from tools.bench.report import brief, calibrate, describe, fmt, invocation, machine, medians, servers
from tools.bench.rig import Context, Metrics
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    names = ", ".join(SCENARIOS)
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help=f"scenarios (default all): {names}")
    p.add_argument("--runs", type=int, default=3, help="runs of each scenario (default 3)")
    p.add_argument("--replicas", type=int, default=3, help="replica processes (default 3)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every size (0.01: a quick run)")
    p.add_argument("--sync-always", action="store_true", help="embedded NATS fsyncs every JetStream write")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    p.add_argument(
        "--vacuum-cost-delay-ms",
        type=_cost_delay,
        metavar="MS",
        help="soak only: autovacuum_vacuum_cost_delay of `timers` (0 to 100; default the migrations' 5)",
    )
    p.add_argument(
        "--soak-rate",
        type=_soak_rate,
        metavar="N",
        help=f"soak only: N timers scheduled a second (1 to {MAX_SOAK_RATE:,}; default 500)",
    )


def _cost_delay(text: str) -> float:
    """Postgres' range for autovacuum_vacuum_cost_delay, checked before any server runs."""
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
    """Every scenario with a target, but those too long for every run (on request)."""
    return [n for n, s in SCENARIOS.items() if s.targets and not s.on_request]


def run_bench(args: argparse.Namespace, command: str) -> int:
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown:
        print(f"unknown scenario: {', '.join(unknown)} (known: {', '.join(SCENARIOS)})", file=sys.stderr)
        return 2
    chosen = [SCENARIOS[s] for s in args.scenarios or default_scenarios()]
    for flag in ("--vacuum-cost-delay-ms", "--soak-rate"):
        if getattr(args, flag[2:].replace("-", "_")) is not None and SCENARIOS["soak"] not in chosen:
            print(f"{flag} applies to the soak only: name `soak` with it", file=sys.stderr)
            return 2
    with servers("bench", sync_always=args.sync_always) as (db_url, nats_url, tmp):
        calibration = [calibrate(tmp)]
        results: dict[str, Any] = {}
        for scenario in chosen:
            runs: list[Metrics] = []
            for i in range(args.runs):

                def progress(msg: str, name: str = scenario.name, run: int = i + 1) -> None:
                    print(f"[{name} {run}/{args.runs}] {msg}", file=sys.stderr, flush=True)

                ctx = Context(
                    db_url, nats_url, tmp, args.replicas, args.scale, progress,
                    args.vacuum_cost_delay_ms, args.soak_rate,
                )  # fmt: skip
                started = time.monotonic()
                try:
                    runs.append(asyncio.run(scenario.run(ctx)))
                except RuntimeError as exc:  # a scenario that could not finish says why, in one line
                    print(f"bench {scenario.name}: {exc}", file=sys.stderr)
                    return 1
                progress(f"done in {time.monotonic() - started:.0f}s: {brief(runs[-1])}")
            results[scenario.name] = {
                "runs": runs,
                "median": medians(runs),
                "targets": _verdicts(scenario, runs),
            }
        calibration.append(calibrate(tmp))
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


def _verdicts(scenario: Scenario, runs: list[Metrics]) -> list[dict[str, Any]]:
    out = []
    for metric, op, target in scenario.targets:
        value = statistics.median(r[metric] for r in runs)
        met = value >= target if op == ">=" else value <= target
        out.append({"metric": metric, "op": op, "target": target, "median": value, "met": met})
    return out


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
            lines.append(
                f"| {name} | {v['metric']} | {fmt(v['median'])} | {fmt(min(values))} .. {fmt(max(values))} "
                f"| {v['op']} {fmt(v['target'])} | {'yes' if v['met'] else 'NO'} |"
            )
    lines.append("")
    lines += [f"{name}: {brief(res['median'])}" for name, res in report["results"].items()]
    return "\n".join(lines)
