"""What every benchmark scenario is given (Context) and returns (Metrics), and the measures they
share: apart from the list of scenarios (scenarios.py), which imports the modules that hold
scenarios of their own, so none of them imports it back."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import tools
from tools.bench.rig import COUNT_SCHEDULED_SQL, Rig
from worker.devkit.harness import percentile
from worker.devkit.recorder import Firing

Progress = Callable[[str], None]
Metrics = dict[str, float]
ROOT = Path(tools.__file__).resolve().parent.parent  # the checkout: a child imports tools from it


@dataclass(frozen=True)
class Context:
    admin_url: str
    nats_url: str
    workdir: Path
    replicas: int
    scale: float
    progress: Progress
    # The soak's `--vacuum-cost-delay-ms`: the autovacuum_vacuum_cost_delay it sets on `timers`
    # (None: as the migrations leave it).
    vacuum_cost_delay_ms: float | None = None
    # The soak's `--soak-rate`: ScheduleTimer commands a second (None: its own 500).
    soak_rate: int | None = None

    def n(self, full: int, floor: int = 1000) -> int:
        return max(floor, int(full * self.scale))

    def seconds(self, full: float, floor: float = 10) -> float:
        return max(floor, full * self.scale)

    def rig(self, **settings: Any) -> Rig:
        return Rig(self.admin_url, self.nats_url, self.workdir, **settings)


async def python_child(call: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """`call`, Python code importing from tools/bench, in a process of its own (its stdout a
    pipe): what must not share the bench's interpreter, whose pauses would be in its timings."""
    root = str(ROOT)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        call,
        cwd=root,
        env={**os.environ, "PYTHONPATH": root, **(env or {})},
        stdout=asyncio.subprocess.PIPE,
    )


def lateness_ms(events: list[Firing], prefix: str) -> Metrics:
    """Percentiles of receive time minus dueAt for the first receipt of each timer with this key prefix."""
    first: dict[str, Firing] = {}
    for e in events:
        if e.service_call_id.startswith(prefix) and e.service_call_id not in first:
            first[e.service_call_id] = e
    late = [(e.received_at - e.due_at) * 1000 for e in first.values()]
    # reachedAt is the replica's database-clock time at publish: how much of the lateness is
    # the replica's (waking, claiming), the rest being the publish and the delivery.
    reached = [(e.reached_at - e.due_at) * 1000 for e in first.values()]
    # Receive time minus reachedAt: the publish and the delivery, plus however far the replica's
    # estimate of the database clock was behind the real one (it is never ahead).
    hop = [(e.received_at - e.reached_at) * 1000 for e in first.values()]
    return {
        "reached_p50_ms": percentile(reached, 50),
        "reached_p99_ms": percentile(reached, 99),
        "hop_p50_ms": percentile(hop, 50),
        "hop_p99_ms": percentile(hop, 99),
        "lateness_p50_ms": percentile(late, 50),
        "lateness_p99_ms": percentile(late, 99),
        "lateness_max_ms": max(late, default=float("nan")),
        "early": sum(1 for x in late if x < 0),
    }


async def until_fired(rig: Rig, n: int, timeout: float, progress: Progress, rss: list[float]) -> None:
    """Poll the event stream until it holds n events; sample replica memory on the way."""
    deadline = time.monotonic() + timeout
    last = 0.0
    while True:
        state = await rig.events_state()
        rss.extend(rig.rss_mb().values())
        if state.messages >= n:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {state.messages} of {n} fired in {timeout:.0f}s; logs in {rig.workdir}")
        if time.monotonic() - last > 2:
            progress(f"fired {state.messages:,}/{n:,}")
            last = time.monotonic()
        await asyncio.sleep(0.25)


async def until_marked(rig: Rig, key_prefix: str, timeout: float = 60) -> int:
    """Wait until no timer with this key prefix is left Scheduled; the number still left."""
    deadline = time.monotonic() + timeout
    left = -1
    while time.monotonic() < deadline:
        left = int(await rig.scalar(COUNT_SCHEDULED_SQL, key_prefix + "%"))
        if left == 0:
            break
        await asyncio.sleep(0.25)
    return left


def schedule_command(prefix: str, tenant: str, key: str, due: datetime) -> tuple[str, bytes]:
    payload = {"tenantId": tenant, "serviceCallId": key, "dueAt": due.isoformat().replace("+00:00", "Z")}
    body = {
        "id": str(uuid.uuid4()),
        "type": "ScheduleTimer",
        "tenantId": tenant,
        "timestampMs": time.time_ns() // 1_000_000,
        "payload": payload,
    }
    return f"{prefix}.{tenant}.timer.schedule", json.dumps(body).encode()
