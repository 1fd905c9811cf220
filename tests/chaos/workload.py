"""The chaos workload: timers of every kind sent at a steady rate, and a record of what was sent.

Kinds, by key: `plain` (one ScheduleTimer), `duplicate` (the same command sent three times),
`reschedule` (moved before it is due, then a stale copy of the first command, which must not win),
`cancel` (cancelled before it is due, then a stale copy of the ScheduleTimer, which must not re-arm
it), `recurring` (a few occurrences two seconds apart). Poison commands are mixed in; each must
land in the DLQ, once. Due times are always a few seconds after the command is sent, so the
faults hit timers at every stage: stored, claimed, published, recorded.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import math
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import nats
import nats.errors
from nats.aio.client import Client as NATS

from worker.contract import iso

Kind = Literal["plain", "duplicate", "reschedule", "cancel", "recurring"]
KINDS: list[tuple[Kind, float]] = [
    ("plain", 0.55),
    ("duplicate", 0.1),
    ("reschedule", 0.15),
    ("cancel", 0.12),
    ("recurring", 0.08),
]
TENANTS = ["acme", "globex", "initech", "umbrella", "hooli"]
LEAD_S = (6.0, 12.0)  # a timer comes due this long after its command is sent
FOLLOW_UP_S = (0.3, 1.5)  # reschedules and cancels follow this long after the first command
RECURRING_EVERY_S = 2
RECURRING_TIMES = 4
PUBLISH_DEADLINE_S = 90.0  # a command is retried through a NATS outage for this long
# (monotonic send time, order, subject, body, the timer it is a command of: None for poison)
Queued = tuple[float, int, str, bytes, "Timer | None"]


@dataclass
class Timer:
    tenant: str
    id: str
    kind: Kind
    dues: list[int] = field(default_factory=list)  # each dueAt sent, in order (epoch milliseconds)
    stored: list[int] = field(default_factory=list)  # each command's command stream sequence

    @property
    def key(self) -> tuple[str, str]:
        return (self.tenant, self.id)

    def occurrences(self) -> list[int]:
        """Due times (epoch ms) of a recurring timer's occurrences."""
        return [self.dues[0] + k * RECURRING_EVERY_S * 1000 for k in range(RECURRING_TIMES)]


def poison(tenant: str, n: int) -> tuple[str, bytes]:
    """The n-th poison command: (subject tenant token and kind, body), each body unique."""
    sc = f"poison-{n}"
    bodies: list[tuple[str, Any]] = [
        (f"{tenant}.timer.schedule", b"{not json " + sc.encode()),
        (f"{tenant}.timer.schedule", {"tenantId": tenant, "serviceCallId": sc, "dueAt": "tomorrow"}),
        (f"{tenant}.timer.schedule", {"tenantId": "someone-else", "serviceCallId": sc, "dueAt": iso_now()}),
        (f"{tenant}.timer.schedule", {"tenantId": tenant, "serviceCallId": sc}),
        (f"{tenant}.timer.cancel", {"tenantId": tenant, "serviceCallId": "", "n": sc}),
        ("bad$tenant.timer.schedule", {"tenantId": "bad$tenant", "serviceCallId": sc, "dueAt": iso_now()}),
        (
            f"{tenant}.timer.schedule",
            {"tenantId": tenant, "serviceCallId": sc, "dueAt": iso_now(), "repeat": {"every": "PT0S"}},
        ),
        (f"{tenant}.timer.schedule", f'{{"tenantId": "{tenant}", "serviceCallId": "{sc}", "x": NaN}}'),
    ]
    where, body = bodies[n % len(bodies)]
    if isinstance(body, str):
        return where, body.encode()
    return where, body if isinstance(body, bytes) else json.dumps(body).encode()


def iso_now() -> str:
    return iso(datetime.now(UTC))


class Workload:
    """Sends `n` timers over `span_s` seconds (plus poison), and remembers what it sent."""

    def __init__(self, n: int, span_s: float, seed: int = 7, poison_every: int = 100) -> None:
        rng = random.Random(seed)
        names, weights = zip(*KINDS, strict=True)
        self.timers = [
            Timer(TENANTS[i % len(TENANTS)], f"c-{i}", rng.choices(names, weights)[0]) for i in range(n)
        ]
        self.span_s = span_s
        self.poison_every = poison_every
        self.poison: set[tuple[str, bytes]] = set()  # (DLQ subject suffix, body)
        self.commands_sent = 0
        self.publish_retries = 0
        self._rng = rng
        self._nc: NATS | None = None

    async def run(self, nats_url: str, prefix: str) -> None:
        """Send everything, each command at its moment; returns when the last one is stored."""
        self._nc = await nats.connect(nats_url.split(","), max_reconnect_attempts=-1, reconnect_time_wait=0.2)
        js = self._nc.jetstream()
        start = time.monotonic()
        rate = len(self.timers) / self.span_s
        # First commands go out at the rate; their follow-ups wait in the queue for their moment.
        queue: list[Queued] = []
        order = itertools.count()  # ties in send time keep the order they were made in
        try:
            for i, timer in enumerate(self.timers):
                await self._send_due(queue, js, until=start + i / rate)
                for at, subject, body in self._commands(timer, prefix):
                    heapq.heappush(queue, (at, next(order), subject, body, timer))
                if i % self.poison_every == 0:
                    where, body = poison(timer.tenant, i // self.poison_every)
                    self.poison.add((where.split(".")[0], body))
                    heapq.heappush(queue, (time.monotonic(), next(order), f"{prefix}.{where}", body, None))
            await self._send_due(queue, js, until=math.inf)
        finally:
            await self._nc.close()

    async def _send_due(self, queue: list[Queued], js: Any, until: float) -> None:
        """Send what is due before `until`, each at its moment; then wait for `until`."""
        while queue and queue[0][0] <= until:
            at, _, subject, body, timer = heapq.heappop(queue)
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            seq = await self._publish(js, subject, body)
            if timer is not None:
                timer.stored.append(seq)
        if until != math.inf:
            await asyncio.sleep(max(0.0, until - time.monotonic()))

    def _commands(self, t: Timer, prefix: str) -> list[tuple[float, str, bytes]]:
        """The commands of one timer: (monotonic send time, subject, body). Due times are absolute
        epoch seconds, fixed now; follow-ups keep a lead of a few seconds over their own send."""
        now_m, now = time.monotonic(), time.time()
        due = now + self._rng.uniform(*LEAD_S)
        schedule, cancel = f"{prefix}.{t.tenant}.timer.schedule", f"{prefix}.{t.tenant}.timer.cancel"
        t.dues.append(ms_of(iso_at(due)))
        ts = int(now * 1000)
        first = self._envelope(t, "ScheduleTimer", ts, {"dueAt": iso_at(due)})
        return self._kind_commands(t, due, now_m, ts, first, schedule, cancel)

    def _kind_commands(
        self, t: Timer, due: float, now_m: float, ts: int, first: bytes, schedule: str, cancel: str
    ) -> list[tuple[float, str, bytes]]:
        follow = now_m + self._rng.uniform(*FOLLOW_UP_S)
        if t.kind == "plain":
            return [(now_m, schedule, self._flat(t, due))]
        if t.kind == "duplicate":
            body = self._flat(t, due)
            return [(now_m, schedule, body), (now_m, schedule, body), (follow, schedule, body)]
        if t.kind == "reschedule":
            moved = due + self._rng.choice([-1, 1]) * self._rng.uniform(1.0, 3.0)
            t.dues.append(ms_of(iso_at(moved)))
            again = self._envelope(t, "ScheduleTimer", ts + 1, {"dueAt": iso_at(moved)})
            return [(now_m, schedule, first), (follow, schedule, again), (follow + 0.2, schedule, first)]
        if t.kind == "cancel":
            stop = self._envelope(t, "CancelTimer", ts + 1, {})
            return [(now_m, schedule, first), (follow, cancel, stop), (follow + 0.2, schedule, first)]
        repeat = {"every": f"PT{RECURRING_EVERY_S}S", "times": RECURRING_TIMES}
        fields = {"dueAt": iso_at(due), "repeat": repeat}
        return [(now_m, schedule, self._envelope(t, "ScheduleTimer", ts, fields))]

    @staticmethod
    def _flat(t: Timer, due: float) -> bytes:
        return json.dumps({"tenantId": t.tenant, "serviceCallId": t.id, "dueAt": iso_at(due)}).encode()

    @staticmethod
    def _envelope(t: Timer, kind: str, ts: int, fields: dict[str, Any]) -> bytes:
        payload = {"tenantId": t.tenant, "serviceCallId": t.id, **fields}
        envelope = {"id": f"{t.id}:{ts}", "type": kind, "tenantId": t.tenant, "timestampMs": ts}
        return json.dumps({**envelope, "payload": payload}).encode()

    async def _publish(self, js: Any, subject: str, body: bytes) -> int:
        """Until JetStream stores it, through outages; its stream sequence. A retry after a lost
        PubAck stores a second copy: one more duplicate command for the service to shrug off."""
        deadline = time.monotonic() + PUBLISH_DEADLINE_S
        while True:
            try:
                ack = await js.publish(subject, body, timeout=2)
                self.commands_sent += 1
                return int(ack.seq)
            except (TimeoutError, nats.errors.Error) as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"no command stored for {PUBLISH_DEADLINE_S}s: {exc}") from exc
                self.publish_retries += 1
                await asyncio.sleep(0.2)


def iso_at(epoch_s: float) -> str:
    return iso(datetime.fromtimestamp(epoch_s, UTC))


def ms_of(rfc3339: str) -> int:
    """Epoch milliseconds of an RFC 3339 time: the form both commands and events carry."""
    return round(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)
