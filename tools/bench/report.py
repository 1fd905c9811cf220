"""What every report of tools/bench carries: the command as typed, the machine and its yardstick
(a CPU loop and an fsync probe, before and after: figures move between hosts and moments), the
servers it ran on, and the way it is printed."""

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


def fsync_ms(directory: Path, writes: int = 50) -> tuple[float, float]:
    """Median and 90th percentile of (write 4 KiB at the file's end + fsync) in `directory`, in ms."""
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
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def calibrate(directory: Path) -> dict[str, Any]:
    """The machine's yardstick now; `directory` on the disk the servers write to."""
    median, p90 = fsync_ms(directory)
    return {
        "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_loop_ms": round(cpu_loop_ms(), 1),
        "fsync_4k_ms_p50": round(median, 3),
        "fsync_4k_ms_p90": round(p90, 3),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def probe(every_s: float = 1.0, n: int = CPU_LOOP_N // 10) -> None:
    """A tenth of the loop once every `every_s` until killed, a line `epoch ms` each: in a process
    of its own (soak.py), or it would stall the consumer whose receive times it measures."""
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
    """What the results were measured on."""
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
    """The command as it was typed (`make <target> ARGS=...` when make ran the module), after the
    TIMER_* settings the replicas inherit: another configuration, and the report says so."""
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


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    return argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n\n")[0])


def positive(prog: str, args: argparse.Namespace, *flags: str) -> bool:
    """Whether every one of these flags is at least 1; if not, says so in one line."""
    if min(getattr(args, f.lstrip("-").replace("-", "_")) for f in flags) >= 1:
        return True
    names = ", ".join(flags[:-1]) + f" and {flags[-1]}" if len(flags) > 1 else flags[0]
    print(f"{prog}: {names} must be at least 1", file=sys.stderr)
    return False


def progress_to_stderr(tag: str) -> Callable[[str], None]:
    def progress(msg: str) -> None:
        print(f"[{tag}] {msg}", file=sys.stderr, flush=True)

    return progress


@contextmanager
def servers(prefix: str, sync_always: bool = False) -> Iterator[tuple[str, str, Path]]:
    """The embedded servers in a throwaway directory (or TIMER_DATABASE_URL and TIMER_NATS_URL):
    (database URL, NATS URL, the directory)."""
    from worker.devkit.dev import servers as dev_servers  # not loaded for a bench that needs none

    with (
        tempfile.TemporaryDirectory(prefix=f"timer-{prefix}-") as tmp,
        dev_servers(Path(tmp), sync_always=sync_always) as (db_url, nats_url),
    ):
        yield db_url, nats_url, Path(tmp)


def on_servers(
    prog: str,
    argv: list[str] | None,
    run: Callable[[str, str, Path], Coroutine[Any, Any, dict[str, Any]]],
    as_json: bool,
) -> dict[str, Any] | int:
    """`run(db_url, nats_url, workdir)` on the servers between two calibrations: its report, whose
    head is printed for a table to follow; or the exit status, 0 (printed as JSON) or 2 (no servers)."""
    from worker.errors import ConfigError
    from worker.logs import redact

    try:
        with servers(prog.rsplit(".", 1)[-1]) as (db_url, nats_url, tmp):
            calibration = [calibrate(tmp)]
            result = asyncio.run(run(db_url, nats_url, tmp))
            calibration.append(calibrate(tmp))
    except ConfigError as exc:
        print(f"{prog}: {redact(str(exc))}", file=sys.stderr)
        return 2
    command = " ".join([prog, *(argv if argv is not None else sys.argv[1:])])
    report = {"command": command, "calibration": calibration} | result
    if as_json:
        print(json.dumps(report, indent=2))
        return 0
    print(report["command"])
    for c in report["calibration"]:
        print(describe(c))
    return report


def around_loop(measure: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`measure()`'s figures with the CPU loop before and after and the load average: the head of
    the one-process benchmarks' reports."""
    before = cpu_loop_ms()
    result = measure()
    return {"cpu_loop_ms": [before, cpu_loop_ms()], **result, "load_average": _load()}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def source_at(rev: str, path: str) -> str:
    """`path` as it was at a git revision of this checkout; ValueError when it was not there."""
    try:
        shown = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, capture_output=True, text=True)
    except FileNotFoundError:
        raise ValueError("--against needs git and a clone of the repository") from None
    if shown.returncode != 0:
        raise ValueError(f"no {path} at {rev!r}: {shown.stderr.strip()}")
    return shown.stdout


def module_of(source: str, origin: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    sys.modules[name] = module  # dataclasses look their module up while the classes are made
    exec(compile(source, origin, "exec"), module.__dict__)
    return module
