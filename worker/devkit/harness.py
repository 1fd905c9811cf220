"""Running replicas as real processes, and what they fired in sum: for `dev`, `bench` and tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from worker.devkit.recorder import EventRecorder


def replica_env(settings_env: Mapping[str, str], worker_id: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(settings_env)
    env["TIMER_WORKER_ID"] = worker_id
    env.setdefault("TIMER_HTTP_PORT", "0")
    return env


class ReplicaSet:
    """N `timer-service <command>` processes; each can be stopped, killed, paused or replaced."""

    def __init__(
        self, env: Mapping[str, str], log_dir: Path, prefix: str = "replica", command: str = "run"
    ) -> None:
        self.env = dict(env)
        self.log_dir = log_dir
        self.prefix = prefix
        self.command = command
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self._started = 0

    def start(self, n: int = 1, extra_env: Mapping[str, str] | None = None) -> list[str]:
        names = []
        for _ in range(n):
            self._started += 1
            name = f"{self.prefix}-{self._started}"
            env = replica_env({**self.env, **(extra_env or {})}, name)
            log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115  # the child owns it
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "worker", self.command], env=env, stdout=log, stderr=subprocess.STDOUT
            )
            log.close()
            names.append(name)
        return names

    def signal(self, name: str, sig: signal.Signals) -> None:
        self.procs[name].send_signal(sig)

    def kill(self, name: str) -> None:
        self.procs[name].kill()
        self.procs[name].wait(timeout=10)

    def terminate_all(self, timeout: float = 20.0) -> dict[str, int | None]:
        """SIGTERM every live replica and wait; the exit codes (None: had to be killed)."""
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGCONT)
                    p.terminate()
        codes: dict[str, int | None] = {}
        deadline = time.monotonic() + timeout
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                codes[name] = None
        return codes

    def alive(self) -> list[str]:
        return [n for n, p in self.procs.items() if p.poll() is None]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate_all()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def summary(scheduled: set[tuple[str, str]], recorder: EventRecorder) -> dict[str, Any]:
    counts = recorder.keys()
    fired = {k for k in counts if k in scheduled}
    lateness = [(f.received_at - f.due_at) * 1000 for f in recorder.firings]
    return {
        "scheduled": len(scheduled),
        "fired": len(fired),
        "lost": len(scheduled - fired),
        "duplicates": sum(n - 1 for k, n in counts.items() if k in scheduled),
        "early": sum(1 for x in lateness if x < 0),
        "p50_lateness_ms": percentile(lateness, 50),
        "p99_lateness_ms": percentile(lateness, 99),
        "max_lateness_ms": max(lateness, default=float("nan")),
    }


def replica_env_from(database_url: str, nats_url: str, **extra: Any) -> dict[str, str]:
    env = {"TIMER_DATABASE_URL": database_url, "TIMER_NATS_URL": nats_url}
    env.update({f"TIMER_{k.upper()}": str(v) for k, v in extra.items()})
    return env
