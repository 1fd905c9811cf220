"""`make bench-peers`: this service beside graphile-worker, pgqueuer and NATS message schedules.

The same workloads for each on one embedded Postgres and NATS (docs/BENCHMARKS.md, "Side by
side"): a drain of N overdue jobs on each table shape of shapes.py, the workers started after the
insert; and lateness, R due a second for S seconds, the workers already running.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.bench.peer_queues import WORKERS, GraphileWorker, PgQueuer, install_peers
from tools.bench.peer_systems import Measured, NatsSchedules, Ours, Receipt, System, shared_servers
from tools.bench.report import calibrate, describe, fmt, invocation, machine, parser, progress_to_stderr
from tools.bench.rig import admin
from tools.bench.shapes import FULL_BIG, SHAPES
from worker.devkit.harness import percentile

SYSTEMS = ("timer-service", "timer-service-push", "graphile-worker", "pgqueuer", "nats-schedules")
REFERENCE = "graphile-worker"  # every drain's rate is also given as a ratio to its, round by round
PROG = "python -m tools.bench.peers"
LATENESS = ("p50_ms", "p99_ms", "max_ms")


def drain_rate(receipts: list[Receipt]) -> float:
    """Fires per second from the first receive to the last."""
    times = [r for _, r in receipts]
    span = max(times) - min(times)
    return (len(times) - 1) / span if span > 0 else float("nan")


def lateness_ms(receipts: list[Receipt]) -> dict[str, float]:
    late = [(r - d) * 1000 for d, r in receipts]
    return {
        "p50_ms": percentile(late, 50),
        "p99_ms": percentile(late, 99),
        "max_ms": max(late, default=float("nan")),
    }


def cpu_ms_per_1k(m: Measured) -> dict[str, float]:
    """CPU milliseconds per 1,000 fires, per component and in total."""
    per = {k: v / max(m.fires_in_window, 1) * 1e6 for k, v in m.cpu_s.items()}
    return {**per, "total": sum(per.values())}


def _drain_summary(rounds: list[dict[str, Any]], reference: list[dict[str, Any]] | None) -> dict[str, Any]:
    """One system's drains of one shape; the ratio is to graphile-worker's in the same round (a
    slow minute of the machine hits both)."""
    rates = [r["fires_per_s"] for r in rounds]
    ratios = [r["fires_per_s"] / g["fires_per_s"] for r, g in zip(rounds, reference or [], strict=False)]
    return {
        "fires_per_s": statistics.median(rates),
        "min": min(rates),
        "max": max(rates),
        "over_reference": statistics.median(ratios) if ratios else float("nan"),
        "over_reference_rounds": ratios,
        "cpu_ms_per_1k": {
            k: statistics.median(r["cpu_ms_per_1k"][k] for r in rounds) for k in rounds[0]["cpu_ms_per_1k"]
        },
        "wal_bytes_per_fire": statistics.median(r.get("wal_bytes_per_fire", float("nan")) for r in rounds),
        "due_pages": statistics.median(r.get("due_pages", float("nan")) for r in rounds),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per system: per shape its drain's medians, range and ratio, and its lateness' medians."""
    out: dict[str, dict[str, Any]] = {}
    for system, rs in runs.items():
        drains: dict[str, Any] = {}
        for shape in rs[0]["drain"]:
            reference = [r["drain"].get(shape) for r in runs.get(REFERENCE, [])]
            drains[shape] = _drain_summary(
                [r["drain"][shape] for r in rs], reference if all(reference) else None
            )
        lateness = {k: statistics.median(r["lateness"][k] for r in rs) for k in LATENESS}
        out[system] = {"drain": drains, "lateness": lateness}
    return out


def _ratio(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def table(report: dict[str, Any]) -> str:
    """Markdown tables: each system's drain on each shape, then lateness."""
    cfg = report["config"]
    lines = [
        f"{report['command']}  ({cfg['runs']} runs; drain {cfg['drain_n']:,} overdue, big table "
        f"{cfg['big']:,}; lateness {cfg['rate']:,}/s for {cfg['seconds']:.0f} s; {cfg['replicas']} "
        f"replicas of ours, {WORKERS} worker processes for each peer"
        + "".join(f"; {k}={v}" for k, v in cfg.get("pg_settings", {}).items())
        + ")",
        *(describe(c) for c in report["calibration"]),
        "",
        f"| system | table | drain fires/s (median) | min .. max | ÷ {REFERENCE} by round (median) "
        "| CPU ms per 1,000 (total: postgres / nats / workers / consumer) | WAL bytes per fire "
        "| heap pages of the due jobs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for system, s in report["summary"].items():
        for shape, d in s["drain"].items():
            c = d["cpu_ms_per_1k"]
            parts = " / ".join(fmt(c.get(k, 0.0)) for k in ("postgres", "nats", "workers", "consumer"))
            rounds = ", ".join(_ratio(x) for x in d["over_reference_rounds"])
            lines.append(
                f"| {system} | {shape} | {fmt(d['fires_per_s'])} | {fmt(d['min'])} .. {fmt(d['max'])} "
                f"| {rounds} (**{_ratio(d['over_reference'])}**) | {fmt(c['total'])}: {parts} "
                f"| {fmt(d['wal_bytes_per_fire'])} | {fmt(d['due_pages'])} |"
            )
    lines += ["", "| system | lateness p50 / p99 / max ms |", "|---|---|"]
    for system, s in report["summary"].items():
        lines.append(f"| {system} | {' / '.join(fmt(s['lateness'][k]) for k in LATENESS)} |")
    return "\n".join(lines)


def pg_setting(text: str) -> tuple[str, str]:
    """--pg-setting NAME=VALUE, as argparse reads it."""
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[a-z_]+", name):
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=VALUE, e.g. wal_compression=pglz")
    return name, value


def _one(system: System, args: argparse.Namespace, progress: Callable[[str], None]) -> dict[str, Any]:
    """One round of a system: its drain on each shape it has, then its lateness (unless --seconds 0)."""
    drains: dict[str, dict[str, Any]] = {}
    m: dict[str, Any]
    for shape in (s for s in args.shapes if s in system.shapes):
        progress(f"{system.name}: drain of {args.drain:,} ({shape} table)")
        d = asyncio.run(system.drain(args.drain, shape, args.big))
        drains[shape] = m = {
            "fires_per_s": drain_rate(d.receipts),
            "cpu_ms_per_1k": cpu_ms_per_1k(d),
            "wal_bytes_per_fire": d.wal_bytes / max(d.fires_in_window, 1),
            "due_pages": d.due_pages,
        }
        progress(
            f"{system.name}: {shape} drain {m['fires_per_s']:,.0f}/s,"
            f" {m['cpu_ms_per_1k']['total']:.0f} ms CPU per 1,000,"
            f" {m['wal_bytes_per_fire']:,.0f} B of WAL per fire"
            + ("" if d.due_pages != d.due_pages else f", due rows on {d.due_pages:,.0f} heap pages")
        )
    late = dict.fromkeys(LATENESS, float("nan"))
    if args.seconds > 0:
        progress(f"{system.name}: lateness at {args.rate:,}/s for {args.seconds:.0f} s")
        late = lateness_ms(asyncio.run(system.lateness(args.rate, args.seconds)).receipts)
        progress(f"{system.name}: lateness p50 {late['p50_ms']:.1f} p99 {late['p99_ms']:.1f} ms")
    return {"drain": drains, "lateness": late}


def run_peers(args: argparse.Namespace, command: str) -> dict[str, Any]:
    progress = progress_to_stderr("peers")
    chosen = args.systems or list(SYSTEMS)
    with tempfile.TemporaryDirectory(prefix="timer-peers-") as tmp:
        # --tools resolved: the peers' installs run with their own directory as the cwd
        workdir, tools = Path(tmp) / "run", args.tools.resolve() if args.tools else Path(tmp) / "tools"
        workdir.mkdir()
        versions = install_peers(tools, chosen, progress)
        calibration = [calibrate(workdir)]
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in chosen}
        with shared_servers(workdir, tools, progress, args.pg_setting) as shared:
            pg_settings = {name: admin(shared.admin_url, f"SHOW {name}") for name, _ in args.pg_setting}
            make: dict[str, Callable[[], System]] = {
                "timer-service": lambda: Ours(shared, args.replicas),
                "timer-service-push": lambda: Ours(shared, args.replicas, push=True),
                "graphile-worker": lambda: GraphileWorker(shared),
                "pgqueuer": lambda: PgQueuer(shared),
                "nats-schedules": lambda: NatsSchedules(shared),
            }
            for i in range(args.runs):  # interleaved: a slow minute of the machine hits everyone
                for name in chosen:
                    progress(f"run {i + 1}/{args.runs}")
                    runs[name].append(_one(make[name](), args, progress))
        calibration.append(calibrate(workdir))
    config = {"runs": args.runs, "drain_n": args.drain, "big": args.big, "shapes": args.shapes}
    config |= {
        "rate": args.rate,
        "seconds": args.seconds,
        "replicas": args.replicas,
        "pg_settings": pg_settings,
    }
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "calibration": calibration,
        "versions": versions,
        "config": config,
        "runs": runs,
        "summary": summarize(runs),
    }


def main(argv: list[str] | None = None) -> int:
    p = parser(PROG, __doc__)
    p.add_argument("--runs", type=int, default=3, help="runs of each workload per system (default 3)")
    p.add_argument("--drain", type=int, default=50_000, help="overdue jobs in the drain (default 50,000)")
    p.add_argument("--rate", type=int, default=500, help="jobs due per second in lateness (default 500)")
    p.add_argument("--seconds", type=float, default=20, help="how long they come due (default 20; 0: none)")
    p.add_argument(
        "--shapes", nargs="+", choices=SHAPES, default=list(SHAPES), help="drains' tables (default all)"
    )
    p.add_argument(
        "--big", type=int, default=FULL_BIG, help=f"future jobs in the big table (default {FULL_BIG:,})"
    )
    p.add_argument("--replicas", type=int, default=WORKERS, help=f"replicas of ours (default {WORKERS})")
    p.add_argument("--systems", nargs="*", choices=SYSTEMS, help="a subset (default all)")
    p.add_argument("--tools", type=Path, help="keep the peers' installs here and reuse them")
    p.add_argument(
        "--pg-setting",
        type=pg_setting,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Postgres setting for the run, e.g. wal_compression=pglz (repeatable)",
    )
    p.add_argument("--json", action="store_true", help="print every run's figures as JSON")
    given = sys.argv[1:] if argv is None else argv
    args = p.parse_args(given)
    try:
        report = run_peers(args, invocation(PROG, PROG, "bench-peers", given))
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"bench-peers: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
