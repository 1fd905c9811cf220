"""The soak's reading of its samples: each second's deltas, windows of them with their lateness,
and what went on in the seconds whose timers fired late."""

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
    cpu_loop_ms: float = float("nan")  # the probe's run nearest before this sample


def machine_waits_s(stat: Path = Path("/proc/stat")) -> tuple[float, float]:
    """(iowait, steal): seconds all the CPUs waited on I/O or lost to the hypervisor so far."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return math.nan, math.nan
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[5]) / tick, int(fields[8]) / tick


def lateness_by_second(firings: list[tuple[str, float, float]]) -> dict[int, list[float]]:
    """Lateness in ms of each first receipt (key, due, received), by the second it came due."""
    out: dict[int, list[float]] = {}
    for _key, due, received in firings:
        out.setdefault(int(due), []).append((received - due) * 1000)
    return out


def seconds_table(samples: list[Sample], probe: list[tuple[float, float]]) -> list[dict[str, Any]]:
    """Each sample with what changed since the one before (the second it covers)."""
    out: list[dict[str, Any]] = []
    runs = iter(probe)
    run = next(runs, None)
    for before, s in itertools.pairwise(samples):
        loop = []
        while run is not None and run[0] <= s.at:
            if run[0] > before.at:
                loop.append(run[1])
            run = next(runs, None)
        out.append(
            {
                "second": int(s.at),
                "table_mb": s.table_bytes / 2**20,
                "index_mb": s.index_bytes / 2**20,
                "dead": s.dead,
                "deleted": s.deleted - before.deleted,
                "deleting": s.deleting,
                "autovacuums": s.autovacuums - before.autovacuums,
                "autoanalyzes": s.autoanalyzes - before.autoanalyzes,
                "vacuum_phase": s.vacuum_phase,
                "analyze_phase": s.analyze_phase,
                "longest": s.longest,
                "checkpointer": s.checkpointer,
                "checkpoints": s.checkpoints - before.checkpoints,
                "wal_mb": (s.wal_bytes - before.wal_bytes) / 2**20,
                "wal_fpi": s.wal_fpi - before.wal_fpi,
                "wal_switch": int(s.wal_file != before.wal_file),
                "rss_mb": s.rss_mb,
                "pg_cpu": (s.pg_cpu_s - before.pg_cpu_s) / (s.at - before.at),
                "replicas_cpu": (s.replicas_cpu_s - before.replicas_cpu_s) / (s.at - before.at),
                "load_1m": s.load_1m,
                "iowait": (s.iowait_s - before.iowait_s) / (s.at - before.at),
                "steal": (s.steal_s - before.steal_s) / (s.at - before.at),
                "cpu_loop_ms": max(loop) if loop else float("nan"),
            }
        )
    return out


def windows(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], start: float, width: float
) -> list[dict[str, Any]]:
    """One row per `width` seconds from `start`: lateness of the timers due in it, and its seconds."""
    rows: list[dict[str, Any]] = []
    last = max([*late, *(s["second"] for s in seconds)], default=int(start))
    i = 0
    while start + i * width <= last:
        lo, hi = start + i * width, start + (i + 1) * width
        ms = [x for sec, xs in late.items() if lo <= sec < hi for x in xs]
        secs = [s for s in seconds if lo <= s["second"] < hi]
        i += 1
        if not secs and not ms:
            continue
        loops = [s["cpu_loop_ms"] for s in secs if s["cpu_loop_ms"] == s["cpu_loop_ms"]]
        rows.append(
            {
                "t_s": lo - start,
                "fires": len(ms),
                "p50_ms": percentile(ms, 50),
                "p99_ms": percentile(ms, 99),
                "max_ms": max(ms, default=float("nan")),
                "table_mb": secs[-1]["table_mb"] if secs else float("nan"),
                "index_mb": secs[-1]["index_mb"] if secs else float("nan"),
                "dead": secs[-1]["dead"] if secs else 0,
                "deleted": sum(s["deleted"] for s in secs),
                "autovacuums": sum(s["autovacuums"] for s in secs),
                "vacuum_s": sum(1 for s in secs if s["vacuum_phase"]),
                "autoanalyzes": sum(s["autoanalyzes"] for s in secs),
                "checkpoints": sum(s["checkpoints"] for s in secs),
                "checkpointer_s": sum(1 for s in secs if s["checkpointer"] not in IDLE_CHECKPOINTER),
                "wal_mb": sum(s["wal_mb"] for s in secs),
                "wal_switches": sum(s["wal_switch"] for s in secs),
                "rss_mb": max((s["rss_mb"] for s in secs), default=float("nan")),
                "pg_cpu": statistics.fmean(s["pg_cpu"] for s in secs) if secs else float("nan"),
                "cpu_loop_ms_p50": statistics.median(loops) if loops else float("nan"),
                "cpu_loop_ms_max": max(loops, default=float("nan")),
                "load_1m": secs[-1]["load_1m"] if secs else float("nan"),
                "steal_max": max((s["steal"] for s in secs if not math.isnan(s["steal"])), default=math.nan),
            }
        )
    return rows


WINDOW_COLUMNS = (
    ("t_s", "t (s)", "{:.0f}"),
    ("fires", "fires", "{:,}"),
    ("p50_ms", "p50 ms", "{:.1f}"),
    ("p99_ms", "p99 ms", "{:.1f}"),
    ("max_ms", "max ms", "{:.0f}"),
    ("table_mb", "heap MB", "{:.0f}"),
    ("index_mb", "indexes MB", "{:.0f}"),
    ("dead", "dead rows", "{:,}"),
    ("deleted", "deleted", "{:,}"),
    ("autovacuums", "autovacuums", "{}"),
    ("vacuum_s", "vacuum s", "{}"),
    ("autoanalyzes", "autoanalyzes", "{}"),
    ("checkpoints", "checkpoints", "{}"),
    ("checkpointer_s", "checkpointer s", "{}"),
    ("wal_mb", "WAL MB", "{:.1f}"),
    ("wal_switches", "WAL segs", "{}"),
    ("rss_mb", "RSS MB", "{:.0f}"),
    ("pg_cpu", "pg cores", "{:.2f}"),
    ("cpu_loop_ms_p50", "loop p50 ms", "{:.0f}"),
    ("cpu_loop_ms_max", "loop max ms", "{:.0f}"),
    ("load_1m", "load", "{:.1f}"),
    ("steal_max", "steal max cores", "{:.2f}"),
)


def window_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| " + " | ".join(title for _, title, _ in WINDOW_COLUMNS) + " |",
        "|" + "---|" * len(WINDOW_COLUMNS),
    ]
    for r in rows:
        cells = [fmt.format(r[k]) if r[k] == r[k] else "-" for k, _, fmt in WINDOW_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def factors(s: dict[str, Any], wal_typical: float, loop_typical: float) -> list[str]:
    """What went on in one second that could slow a claim, by name."""
    out = []
    if s["vacuum_phase"]:
        out.append(f"autovacuum ({s['vacuum_phase']})")
    if s["autovacuums"]:
        out.append("autovacuum done")
    if s["analyze_phase"]:
        out.append(f"autoanalyze ({s['analyze_phase']})")
    if s["checkpointer"] not in IDLE_CHECKPOINTER:
        out.append(f"checkpointer ({s['checkpointer']})")
    if s["checkpoints"]:
        out.append("checkpoint done")
    if s["deleted"] or s["deleting"]:
        out.append("retention delete")
    if s["wal_switch"]:
        out.append("WAL segment switch")
    if s["wal_mb"] > 2 * wal_typical:
        out.append("WAL burst")
    if s["cpu_loop_ms"] > 1.5 * loop_typical:
        out.append("machine (loop slow)")
    if s["steal"] >= STOLEN_CORES:
        out.append(f"steal ({s['steal']:.2f} cores)")
    if s["iowait"] >= STOLEN_CORES:
        out.append(f"iowait ({s['iowait']:.2f} cores)")
    if s["autoanalyzes"]:
        out.append("autoanalyze done")
    if s["longest"] and int(s["longest"].split()[0]) >= LONG_STATEMENT_MS:
        out.append(f"long statement ({s['longest']})")
    return out


def attribution(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], target: float
) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """Each second with a timer later than `target`, beside what went on in it or the second
    before; and per kind of thing, (slow seconds it went with, all seconds it went on in)."""
    by_second = {s["second"]: s for s in seconds}
    wal_typical = statistics.median([s["wal_mb"] for s in seconds] or [0.0])
    loops = [s["cpu_loop_ms"] for s in seconds if s["cpu_loop_ms"] == s["cpu_loop_ms"]]
    loop_typical = statistics.median(loops or [float("inf")])

    def around(sec: int, detail: bool = False) -> list[str]:
        found: list[str] = []
        for t in (sec - 1, sec):
            for f in factors(by_second[t], wal_typical, loop_typical) if t in by_second else []:
                f = f if detail else f.split(" (")[0]
                if f not in found:
                    found.append(f)
        return found

    lines, counts = [], {}
    slow = sorted(sec for sec, xs in late.items() if max(xs) > target and sec in by_second)
    for sec in slow:
        s = by_second[sec]
        lines.append(
            f"{time.strftime('%H:%M:%S', time.gmtime(sec))} max {max(late[sec]):.0f} ms"
            f" ({len(late[sec])} due): {', '.join(around(sec, detail=True)) or 'nothing sampled'}"
            f"; loop {s['cpu_loop_ms']:.0f} ms, pg {s['pg_cpu']:.2f} cores, load {s['load_1m']:.1f}"
        )
    every = [around(s["second"]) for s in seconds]
    for name in sorted({n for e in every for n in e}):
        counts[name] = (sum(1 for sec in slow if name in around(sec)), sum(1 for e in every if name in e))
    counts["nothing sampled"] = (
        sum(1 for sec in slow if not around(sec)),
        sum(1 for e in every if not e),
    )
    return lines, counts


def quiet_lateness(
    seconds: list[dict[str, Any]], late: dict[int, list[float]], until: float
) -> tuple[int, float]:
    """(How many, their p99): the seconds before `until` whose calibration loop, and the one
    before's, took at most QUIET_LOOP times its 10th percentile: the service's own lateness."""
    loops = sorted(s["cpu_loop_ms"] for s in seconds if s["cpu_loop_ms"] == s["cpu_loop_ms"])
    if not loops:
        return 0, float("nan")
    bound = QUIET_LOOP * loops[len(loops) // 10]
    loop = {s["second"]: s["cpu_loop_ms"] for s in seconds}
    quiet = [s for s in late if s < until and max(loop.get(s, math.inf), loop.get(s - 1, math.inf)) <= bound]
    return len(quiet), percentile([x for sec in quiet for x in late[sec]], 99)


def summary(
    samples: list[Sample],
    probe: list[tuple[float, float]],
    received: dict[str, tuple[float, float]],
    start: float,
    width: float,
    duration: float,
    progress: Any,
) -> dict[str, float]:
    """The soak's lateness measures, its tables said through `progress` (and written as JSON to
    $BENCH_SOAK_SECONDS when set)."""
    late = lateness_by_second([(k, due, got) for k, (due, got) in received.items()])
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
    loops = [w["cpu_loop_ms_max"] for w in full if not math.isnan(w["cpu_loop_ms_max"])]
    return {
        "early": sum(1 for x in all_ms if x < 0),
        "lateness_p50_ms": percentile(all_ms, 50),
        "lateness_p99_ms": percentile(all_ms, 99),
        "lateness_max_ms": max(all_ms, default=float("nan")),
        "windows": len(full),
        "max_window_p99_ms": max((w["p99_ms"] for w in full), default=float("nan")),
        "slow_windows": sum(1 for w in full if w["p99_ms"] > TARGET_P99_MS),
        "quiet_seconds": quiet_seconds,
        "quiet_p99_ms": quiet_p99,
        "autovacuums": sum(s["autovacuums"] for s in seconds),
        "checkpoints": sum(s["checkpoints"] for s in seconds),
        "wal_mb": sum(s["wal_mb"] for s in seconds),
        "deleted": sum(s["deleted"] for s in seconds),
        "size_growth_mb": _growth(half, "table_mb") + _growth(half, "index_mb"),
        "rss_growth_mb": _growth(half, "rss_mb"),
        "rss_max_mb": max((s["rss_mb"] for s in seconds), default=0.0),
        "cpu_loop_ms_max": max(loops, default=float("nan")),
    }


def _growth(rows: list[dict[str, Any]], key: str) -> float:
    return float(rows[-1][key] - rows[0][key]) if len(rows) > 1 else 0.0
