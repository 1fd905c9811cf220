"""The soak's reading of its samples: each second's deltas, windows of them, and the slow seconds."""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.devkit.harness import percentile

TARGET_P99_MS = 50.0  # every window's
QUIET_LOOP = 1.5  # a second whose calibration loop ran this much over the run's fast ones was not quiet
LONG_STATEMENT_MS = 100  # a statement running this long when sampled is named beside its second
STOLEN_CORES = 0.1  # a second whose CPUs lost this much to the hypervisor (or waited on I/O) says so
IDLE_CHECKPOINTER = (None, "CheckpointerMain")  # its wait between checkpoints
# SAMPLE_SQL's columns, in order: the fields of a Sample it fills.
SAMPLED = (
    "at", "table_bytes", "index_bytes", "live", "dead", "deleted", "autovacuums", "autoanalyzes",
    "wal_bytes", "wal_file", "vacuum_phase", "checkpointer", "deleting", "wal_fpi", "analyze_phase",
    "longest",
)  # fmt: skip
COUNTED = ("deleted", "autovacuums", "autoanalyzes", "checkpoints", "wal_fpi")  # a second's: the difference
AS_READ = (
    "dead",
    "deleting",
    "vacuum_phase",
    "analyze_phase",
    "longest",
    "checkpointer",
    "rss_mb",
    "load_1m",
)
CORES = ("pg_cpu", "replicas_cpu", "iowait", "steal")  # seconds of CPU a second, from `<name>_s`
# A window's columns: key, title, format.
WINDOW_COLUMNS = [
    tuple(c.split(":", 2))
    for c in (  # noqa: SIM905  # a literal would take a line a column
        "t_s:t (s):{:.0f};fires:fires:{:,};p50_ms:p50 ms:{:.1f};p99_ms:p99 ms:{:.1f};max_ms:max ms:{:.0f};"
        "table_mb:heap MB:{:.0f};index_mb:indexes MB:{:.0f};dead:dead rows:{:,};deleted:deleted:{:,};"
        "autovacuums:autovacuums:{};vacuum_s:vacuum s:{};autoanalyzes:autoanalyzes:{};"
        "checkpoints:checkpoints:{};checkpointer_s:checkpointer s:{};wal_mb:WAL MB:{:.1f};"
        "wal_switches:WAL segs:{};rss_mb:RSS MB:{:.0f};pg_cpu:pg cores:{:.2f};"
        "cpu_loop_ms_p50:loop p50 ms:{:.0f};cpu_loop_ms_max:loop max ms:{:.0f};load_1m:load:{:.1f};"
        "steal_max:steal max cores:{:.2f}"
    ).split(";")
]


@dataclass
class Sample:
    """One second of the server and the machine: counters as read (deltas come later)."""

    at: float
    table_bytes: int
    index_bytes: int
    live: int
    dead: int
    deleted: int
    autovacuums: int
    autoanalyzes: int
    wal_bytes: int
    wal_file: str
    vacuum_phase: str | None
    checkpointer: str | None
    deleting: int  # DELETE statements running then
    wal_fpi: int
    analyze_phase: str | None
    longest: str | None  # the longest-running statement then: "<ms> ms <text>"
    checkpoints: int
    rss_mb: float  # the largest replica's
    pg_cpu_s: float
    replicas_cpu_s: float
    load_1m: float
    iowait_s: float = float("nan")  # the machine's, all CPUs, so far
    steal_s: float = float("nan")


def machine_waits_s(stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(iowait, steal): seconds all the CPUs waited on I/O or lost to the hypervisor so far."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return math.nan, math.nan
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[5]) / tick, int(fields[8]) / tick


def seconds_table(samples: list[Sample], probe: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Each sample with what changed since the one before (the second it covers)."""
    out: list[dict[str, Any]] = []
    for before, s in itertools.pairwise(samples):
        loop = [ms for at, ms in probe if before.at < at <= s.at]
        dt = s.at - before.at
        out.append(
            {"second": int(s.at), "table_mb": s.table_bytes / 2**20, "index_mb": s.index_bytes / 2**20}
            | {k: getattr(s, k) for k in AS_READ}
            | {k: getattr(s, k) - getattr(before, k) for k in COUNTED}
            | {k: (getattr(s, f"{k}_s") - getattr(before, f"{k}_s")) / dt for k in CORES}
            | {
                "wal_mb": (s.wal_bytes - before.wal_bytes) / 2**20,
                "wal_switch": int(s.wal_file != before.wal_file),
            }
            | {"cpu_loop_ms": max(loop, default=math.nan)}
        )
    return out


def windows(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], start: float, width: float
) -> list[dict[str, Any]]:
    """One row per `width` seconds from `start`: lateness of the timers due in it, and its seconds."""
    rows: list[dict[str, Any]] = []
    last = max([*late, *(s["second"] for s in seconds)], default=int(start))
    for i in range(int((last - start) // width) + 1):
        lo, hi = start + i * width, start + (i + 1) * width
        ms = [x for sec, xs in late.items() if lo <= sec < hi for x in xs]
        secs = [s for s in seconds if lo <= s["second"] < hi]
        if not secs and not ms:
            continue
        end = secs[-1] if secs else dict.fromkeys(("table_mb", "index_mb", "dead", "load_1m"), math.nan)
        loops = [s["cpu_loop_ms"] for s in secs if s["cpu_loop_ms"] == s["cpu_loop_ms"]]
        rows.append(
            {"t_s": lo - start, "fires": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99)}
            | {
                "max_ms": max(ms, default=math.nan),
                **{k: end[k] for k in ("table_mb", "index_mb", "load_1m")},
            }
            | {"dead": end["dead"] if secs else 0, "vacuum_s": sum(1 for s in secs if s["vacuum_phase"])}
            | {k: sum(s[k] for s in secs) for k in ("deleted", "autovacuums", "autoanalyzes", "checkpoints")}
            | {"checkpointer_s": sum(1 for s in secs if s["checkpointer"] not in IDLE_CHECKPOINTER)}
            | {"wal_mb": sum(s["wal_mb"] for s in secs), "wal_switches": sum(s["wal_switch"] for s in secs)}
            | {"rss_mb": max((s["rss_mb"] for s in secs), default=math.nan)}
            | {"pg_cpu": statistics.fmean(s["pg_cpu"] for s in secs) if secs else math.nan}
            | {"cpu_loop_ms_p50": statistics.median(loops) if loops else math.nan}
            | {"cpu_loop_ms_max": max(loops, default=math.nan)}
            | {"steal_max": max((s["steal"] for s in secs if not math.isnan(s["steal"])), default=math.nan)}
        )
    return rows


def window_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| " + " | ".join(title for _, title, _ in WINDOW_COLUMNS) + " |",
        "|" + "---|" * len(WINDOW_COLUMNS),
    ]
    for r in rows:
        lines.append(
            "| " + " | ".join(f.format(r[k]) if r[k] == r[k] else "-" for k, _, f in WINDOW_COLUMNS) + " |"
        )
    return lines


def factors(s: dict[str, Any], wal_typical: float, loop_typical: float) -> list[str]:
    """What went on in one second that could slow a claim, by name."""
    longest = s["longest"] and int(s["longest"].split()[0]) >= LONG_STATEMENT_MS
    named = [
        (s["vacuum_phase"], f"autovacuum ({s['vacuum_phase']})"),
        (s["autovacuums"], "autovacuum done"),
        (s["analyze_phase"], f"autoanalyze ({s['analyze_phase']})"),
        (s["checkpointer"] not in IDLE_CHECKPOINTER, f"checkpointer ({s['checkpointer']})"),
        (s["checkpoints"], "checkpoint done"),
        (s["deleted"] or s["deleting"], "retention delete"),
        (s["wal_switch"], "WAL segment switch"),
        (s["wal_mb"] > 2 * wal_typical, "WAL burst"),
        (s["cpu_loop_ms"] > 1.5 * loop_typical, "machine (loop slow)"),
        (s["steal"] >= STOLEN_CORES, f"steal ({s['steal']:.2f} cores)"),
        (s["iowait"] >= STOLEN_CORES, f"iowait ({s['iowait']:.2f} cores)"),
        (s["autoanalyzes"], "autoanalyze done"),
        (longest, f"long statement ({s['longest']})"),
    ]
    return [name for on, name in named if on]


def attribution(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], target: float
) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """Each second with a timer later than `target` beside what went on in it or the second before;
    per kind of thing, (slow seconds it went with, all seconds it went on in)."""
    by_second = {s["second"]: s for s in seconds}
    wal_typical = statistics.median([s["wal_mb"] for s in seconds] or [0.0])
    loop_typical = statistics.median(
        [s["cpu_loop_ms"] for s in seconds if s["cpu_loop_ms"] == s["cpu_loop_ms"]] or [math.inf]
    )

    def around(sec: int, detail: bool = False) -> list[str]:
        found = [
            f if detail else f.split(" (")[0]
            for t in (sec - 1, sec)
            if t in by_second
            for f in factors(by_second[t], wal_typical, loop_typical)
        ]
        return list(dict.fromkeys(found))

    slow = sorted(sec for sec, xs in late.items() if max(xs) > target and sec in by_second)
    lines = [
        f"{time.strftime('%H:%M:%S', time.gmtime(sec))} max {max(late[sec]):.0f} ms ({len(late[sec])} due):"
        f" {', '.join(around(sec, detail=True)) or 'nothing sampled'};"
        f" loop {by_second[sec]['cpu_loop_ms']:.0f} ms, pg {by_second[sec]['pg_cpu']:.2f} cores,"
        f" load {by_second[sec]['load_1m']:.1f}"
        for sec in slow
    ]
    every = [around(s["second"]) for s in seconds]
    counts = {
        name: (sum(1 for sec in slow if name in around(sec)), sum(1 for e in every if name in e))
        for name in sorted({n for e in every for n in e})
    }
    counts["nothing sampled"] = (sum(1 for sec in slow if not around(sec)), sum(1 for e in every if not e))
    return lines, counts


def quiet_lateness(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], until: float
) -> tuple[int, float]:
    """(How many, their p99): seconds before `until` whose loop, and the one before's, took at most
    QUIET_LOOP times its 10th percentile: the service's own lateness."""
    loops = sorted(s["cpu_loop_ms"] for s in seconds if s["cpu_loop_ms"] == s["cpu_loop_ms"])
    if not loops:
        return 0, math.nan
    bound, loop = QUIET_LOOP * loops[len(loops) // 10], {s["second"]: s["cpu_loop_ms"] for s in seconds}
    quiet = [s for s in late if s < until and max(loop.get(s, math.inf), loop.get(s - 1, math.inf)) <= bound]
    return len(quiet), percentile([x for sec in quiet for x in late[sec]], 99)


def summary(
    samples: list[Sample], probe: list[tuple[float, float]], received: dict[str, tuple[float, float]],
    start: float, width: float, duration: float, progress: Any,
) -> dict[str, float]:  # fmt: skip
    """The soak's lateness measures; its tables said through `progress` (and in $BENCH_SOAK_SECONDS)."""
    late: dict[int, list[float]] = {}
    for due, got in received.values():  # by the second it came due
        late.setdefault(int(due), []).append((got - due) * 1000)
    seconds = seconds_table(samples, probe)
    table = windows(seconds, late, start, width)
    slow, counts = attribution(seconds, late, TARGET_P99_MS)
    for line in window_table(table):
        progress(line)
    progress(f"seconds with a timer later than {TARGET_P99_MS:.0f} ms, and what went on in them:")
    for line in slow:
        progress("  " + line)
    for name, (in_slow, in_all) in counts.items():
        progress(f"  {name}: in {in_slow} of {len(slow)} slow seconds, {in_all} of {len(seconds)}")
    if out := os.environ.get("BENCH_SOAK_SECONDS"):
        Path(out).write_text(
            json.dumps({"seconds": seconds, "lateness_ms": late, "windows": table, "slow": slow})
        )
    all_ms = [x for xs in late.values() for x in xs]
    quiet_seconds, quiet_p99 = quiet_lateness(seconds, late, start + duration)
    full = [w for w in table if w["t_s"] + width <= duration and w["fires"]]  # windows of the load
    half = [w for w in full if w["t_s"] >= duration / 2]  # flat, once retention keeps up

    def growth(key: str) -> float:
        return float(half[-1][key] - half[0][key]) if len(half) > 1 else 0.0

    return {
        "early": sum(1 for x in all_ms if x < 0),
        "lateness_p50_ms": percentile(all_ms, 50),
        "lateness_p99_ms": percentile(all_ms, 99),
        "lateness_max_ms": max(all_ms, default=math.nan),
        "windows": len(full),
        "max_window_p99_ms": max((w["p99_ms"] for w in full), default=math.nan),
        "slow_windows": sum(1 for w in full if w["p99_ms"] > TARGET_P99_MS),
        "quiet_seconds": quiet_seconds,
        "quiet_p99_ms": quiet_p99,
        **{k: sum(s[k] for s in seconds) for k in ("autovacuums", "checkpoints", "wal_mb", "deleted")},
        "size_growth_mb": growth("table_mb") + growth("index_mb"),
        "rss_growth_mb": growth("rss_mb"),
        "rss_max_mb": max((s["rss_mb"] for s in seconds), default=0.0),
        "cpu_loop_ms_max": max(
            (w["cpu_loop_ms_max"] for w in full if w["cpu_loop_ms_max"] >= 0), default=math.nan
        ),
    }
