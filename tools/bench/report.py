"""What every report carries (command, machine, calibration), its printing, and the tools' options."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CPU_LOOP_N = 2_000_000  # about 100-200 ms of one core
# TIMER_* variables the replicas inherit that are not a setting of the run: left out of the command.
_NOT_A_SETTING = re.compile(r"URL|SECRET|PASSWORD|SEED|CREDS|TOKEN|KEY|_FILE$")


def _cpu_loop(n: int) -> int:
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc


def cpu_loop_ms(n: int = CPU_LOOP_N, runs: int = 5) -> float:
    """Median wall time of a fixed pure-Python loop: single-core speed, and how much of it we get."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        _cpu_loop(n)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def calibrate(directory: Path, writes: int = 50) -> dict[str, Any]:
    """The machine's yardstick now: the loop, and 4 KiB write + fsync in `directory` (p50, p90)."""
    block, times = os.urandom(4096), []
    fd, path = tempfile.mkstemp(prefix="fsync-probe-", dir=directory)
    try:
        for _ in range(writes):
            started = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        os.unlink(path)
    times.sort()
    return {
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_loop_ms": round(cpu_loop_ms(), 1),
        "fsync_4k_ms_p50": round(statistics.median(times), 3),
        "fsync_4k_ms_p90": round(times[int(0.9 * (len(times) - 1))], 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def probe(every_s: float = 1.0, n: int = CPU_LOOP_N // 10) -> None:
    """A tenth of the loop every `every_s` until killed, a line `epoch ms` each (the soak's child)."""
    while True:
        started = time.perf_counter()
        _cpu_loop(n)
        print(f"{time.time():.3f} {(time.perf_counter() - started) * 1000:.2f}", flush=True)
        time.sleep(max(0.0, every_s - (time.perf_counter() - started)))


def describe(cal: dict[str, Any]) -> str:
    return (
        f"calibration {cal['at']}: cpu loop {cal['cpu_loop_ms']:.0f} ms, "
        f"fsync 4 KiB p50 {cal['fsync_4k_ms_p50']:.2f} ms / p90 {cal['fsync_4k_ms_p90']:.2f} ms, "
        f"load {cal['load_avg_1m']:.2f}"
    )


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count()}
    try:
        cpu = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model")
        )
        info["cpu"] = cpu.split(":", 1)[1].strip()
        mem = Path("/proc/meminfo").read_text().splitlines()[0].split()[1]
        info["memory_gb"] = round(int(mem) / 1024 / 1024, 1)
    except (OSError, StopIteration):
        pass
    return info


def invocation(prog: str, module_prog: str, make_target: str, argv: list[str]) -> str:
    """The command as typed (`make <target> ARGS=...` under make), after the TIMER_* settings."""
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


def fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:,.0f}" if abs(x) >= 100 else f"{x:.1f}"


def brief(m: dict[str, float], form: Callable[[float], str] = fmt) -> str:
    return " ".join(f"{k}={form(v)}" for k, v in m.items())


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def lines(report: dict[str, Any]) -> str:
    return "\n".join(f"{k}: {v}" for k, v in report.items())


def say(tag: str, msg: str) -> None:
    print(f"[{tag}] {msg}", file=sys.stderr, flush=True)


class Parser(argparse.ArgumentParser):
    counts: list[str]


def parser(prog: str, doc: str | None, counts: dict[str, tuple[int, str]], json_: bool = True) -> Parser:
    """A tool's parser: `counts` are --NAME whole numbers of at least 1 (default, help)."""
    p = Parser(prog=prog, description=(doc or "").split("\n")[0])
    for name, (default, text) in counts.items():
        p.add_argument(f"--{name}", type=int, default=default, help=f"{text} (default {default:,})")
    if json_:
        p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.counts = list(counts)
    return p


def parse(p: Parser, argv: list[str] | None) -> argparse.Namespace | None:
    """The arguments; None when a count is under 1, said in one line."""
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if not p.counts or min(getattr(args, c) for c in p.counts) >= 1:
        return args
    flags = [f"--{c}" for c in p.counts]
    names = ", ".join(flags[:-1]) + f" and {flags[-1]}" if len(flags) > 1 else flags[0]
    print(f"{p.prog}: {names} must be at least 1", file=sys.stderr)
    return None


@contextmanager
def servers(prefix: str, sync_always: bool = False) -> Iterator[tuple[str, str, Path]]:
    """(database URL, NATS URL, a throwaway directory): embedded, or TIMER_DATABASE_URL/NATS_URL."""
    from worker.devkit.dev import servers as dev_servers  # not loaded for a bench that needs none

    with (
        tempfile.TemporaryDirectory(prefix=f"timer-{prefix}-") as tmp,
        dev_servers(Path(tmp), sync_always=sync_always) as (db_url, nats_url),
    ):
        yield db_url, nats_url, Path(tmp)


def on_servers(
    p: Parser, argv: list[str] | None, args: argparse.Namespace, run: Callable[..., Coroutine[Any, Any, Any]]
) -> dict[str, Any] | int:
    """`run(db_url, nats_url, workdir)` between two calibrations: its report, its head printed
    (a table follows); or the exit status, 0 (printed as JSON) or 2 (no servers)."""
    from worker.errors import ConfigError
    from worker.logs import redact

    try:
        with servers(p.prog.rsplit(".", 1)[-1]) as (db_url, nats_url, tmp):
            calibration = [calibrate(tmp)]
            result = asyncio.run(run(db_url, nats_url, tmp))
            calibration.append(calibrate(tmp))
    except ConfigError as exc:
        print(f"{p.prog}: {redact(str(exc))}", file=sys.stderr)
        return 2
    command = " ".join([p.prog, *(argv if argv is not None else sys.argv[1:])])
    report: dict[str, Any] = {"command": command, "calibration": calibration} | result
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print("\n".join([command, *map(describe, calibration)]))
    return report


def around_loop(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`measure()`'s figures between two CPU loops, and the load average."""
    before = cpu_loop_ms()
    result = measure()
    return {
        "cpu_loop_ms": [before, cpu_loop_ms()],
        **result,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def module_at(rev: str, path: str, name: str) -> types.ModuleType:
    """`path` at a git revision of this checkout as module `name`; ValueError when not there."""
    try:
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    except FileNotFoundError:
        raise ValueError("--against needs git and a clone of the repository") from None
    if shown.returncode != 0:
        raise ValueError(f"no {path} at {rev!r}: {shown.stderr.strip()}")
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up while the classes are made
    exec(compile(shown.stdout, f"{rev}:{path}", "exec"), module.__dict__)
    return module


def table_of(rows: dict[str, dict[str, Any]]) -> str:
    """A Markdown table: a row per key, a column per key of the first row's dict."""
    keys = list(next(iter(rows.values()), {}))
    lines = ["| | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, row in rows.items():
        cells = (fmt(v) if isinstance(v, float) else str(v) for v in (row.get(k, float("nan")) for k in keys))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
