"""The rig of tests/integration/test_noisy_neighbour.py: replicas as processes on one database and
stream set, a calm tenant's latencies (command to stored, due to fired) and every replica's /healthz
watched while another tenant floods."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from tests.helpers import http_get, until
from worker.config import Settings
from worker.devkit.harness import percentile
from worker.devkit.recorder import EventRecorder

# The calm tenant's timers per measurement, sent one every SAMPLE_EVERY_S (spread over the flood,
# not a wait for anything), each due DUE_AFTER_S after it was sent: stored well before it is due.
SAMPLES = 20
SAMPLE_EVERY_S = 0.1
DUE_AFTER_S = 1.0
HEALTH_EVERY_S = 0.25
STORED_EVERY_S = 0.02


@dataclass
class Rig:
    settings: Settings
    db_url: str
    ports: list[int]  # each replica's HTTP port
    js: Any
    rec: EventRecorder

    def subject(self, tenant: str, kind: str) -> str:
        return f"{self.settings.subject_prefix}.{tenant}.timer.{kind}"


@dataclass
class Latencies:
    """A tenant's timers: seconds from each command sent to its row stored, and from its dueAt to
    its DueTimeReached received; a timer never seen counts as late as the wait for it lasted."""

    store: list[float]
    fire: list[float]
    missing: int = 0

    @property
    def store_p99(self) -> float:
        return percentile(self.store, 99)

    @property
    def fire_p99(self) -> float:
        return percentile(self.fire, 99)

    def __str__(self) -> str:
        at_least, lost = (">= ", f", {self.missing} not fired") if self.missing else ("", "")
        return (
            f"store p99 {at_least}{self.store_p99 * 1000:.0f} ms,"
            f" fire p99 {at_least}{self.fire_p99 * 1000:.0f} ms{lost}"
        )


@dataclass
class Health:
    """Every /healthz answer that was not 200: (seconds into the watch, port, status; 0 no answer)."""

    started: float = field(default_factory=time.monotonic)
    answers: int = 0
    sick: list[tuple[float, int, int]] = field(default_factory=list)

    def __str__(self) -> str:
        if not self.sick:
            return f"/healthz 200 in all {self.answers} answers"
        first, last = self.sick[0][0], self.sick[-1][0]
        return f"/healthz not 200 in {len(self.sick)} of {self.answers} answers, {first:.1f}..{last:.1f} s in"


def listening_ports(log_dir: Path, names: list[str]) -> list[int] | None:
    """Each replica's HTTP port, from the JSON line it logs once listening; None until all have."""
    ports = []
    for name in names:
        path = log_dir / f"{name}.log"
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        found = [json.loads(x)["port"] for x in lines if '"action": "http_listening"' in x]
        if not found:
            return None
        ports.append(found[0])
    return ports


async def all_healthy(ports: list[int]) -> bool:
    for port in ports:
        with contextlib.suppress(OSError, TimeoutError):
            if (await http_get(port, "/healthz"))[0] == 200 and (await http_get(port, "/readyz"))[0] == 200:
                continue
        return False
    return True


@contextlib.asynccontextmanager
async def watching_health(ports: list[int]) -> AsyncIterator[Health]:
    """/healthz of every replica asked every HEALTH_EVERY_S while the block runs."""
    health = Health()
    stop = asyncio.Event()

    async def watch() -> None:
        while not stop.is_set():
            for port in ports:
                try:
                    status = (await http_get(port, "/healthz"))[0]
                except (OSError, TimeoutError):
                    status = 0
                health.answers += 1
                if status != 200:
                    health.sick.append((time.monotonic() - health.started, port, status))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), HEALTH_EVERY_S)

    task = asyncio.create_task(watch())
    try:
        yield health
    finally:
        stop.set()
        await task


async def measure(rig: Rig, tenant: str, wait_s: float, beside: Awaitable[object] | None = None) -> Latencies:
    """SAMPLES one-shot timers of `tenant`, sent while `beside` runs (and on after it, to SAMPLES),
    and how late each was stored and fired; waits at most `wait_s` past the last one's dueAt."""
    sent: dict[str, float] = {}
    stored: dict[str, float] = {}

    def fired() -> dict[str, float]:
        return {f.service_call_id: f.received_at - f.due_at for f in rig.rec.firings if f.tenant_id == tenant}

    task = asyncio.ensure_future(beside) if beside is not None else None
    async with await psycopg.AsyncConnection.connect(rig.db_url, autocommit=True) as conn:

        async def watch_stored() -> None:
            while len(stored) < SAMPLES:
                cur = await conn.execute("SELECT service_call_id FROM timers WHERE tenant_id = %s", (tenant,))
                now = time.time()
                for (sc,) in await cur.fetchall():
                    stored.setdefault(sc, now)
                await asyncio.sleep(STORED_EVERY_S)

        watcher = asyncio.create_task(watch_stored())
        try:
            for i in range(SAMPLES):
                sc = f"calm-{i}"
                sent[sc] = time.time()
                due = datetime.fromtimestamp(sent[sc] + DUE_AFTER_S, UTC).isoformat()
                body = {"tenantId": tenant, "serviceCallId": sc, "dueAt": due}
                await rig.js.publish(rig.subject(tenant, "schedule"), json.dumps(body).encode())
                await asyncio.sleep(SAMPLE_EVERY_S)
            if task is not None:
                await task
            deadline = max(sent.values()) + DUE_AFTER_S + wait_s
            with contextlib.suppress(TimeoutError):
                await until(
                    lambda: len(fired()) >= SAMPLES, timeout=deadline - time.time(), what="calm fired"
                )
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if task is not None and not task.done():
                task.cancel()
    end = time.time()
    late = fired()
    return Latencies(
        store=[stored.get(sc, end) - at for sc, at in sent.items()],
        fire=[late.get(sc, end - (at + DUE_AFTER_S)) for sc, at in sent.items()],
        missing=SAMPLES - len(late),
    )
