"""A small client for producers: schedule, cancel and get timers without writing subjects by hand.

    async with await TimerClient.connect("nats://127.0.0.1:4222") as timers:
        await timers.schedule("acme", "sc-42", datetime(2026, 11, 22, 9, tzinfo=UTC))
        print(await timers.get("acme", "sc-42"))

`schedule` and `cancel` return once JetStream has stored the command: from then on it is the
service's job. Commands carry `timestampMs`, so an older command never overwrites a newer one.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime
from types import TracebackType
from typing import Any

from nats.aio.client import Client as NATS

from worker.contract import TENANT_RE, Subjects, iso
from worker.natsconn import nats_connect


class TimerClient:
    def __init__(self, nc: NATS, prefix: str = "svc", *, owns_connection: bool = False) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = Subjects(prefix)
        self._owns = owns_connection

    @classmethod
    async def connect(
        cls, url: str = "nats://127.0.0.1:4222", prefix: str = "svc", **options: Any
    ) -> TimerClient:
        # Never in clear when TLS is configured (see natsconn.nats_connect).
        return cls(await nats_connect(url, **options), prefix, owns_connection=True)

    async def schedule(
        self,
        tenant_id: str,
        service_call_id: str,
        due_at: datetime,
        *,
        correlation_id: str | None = None,
        repeat: dict[str, Any] | None = None,
        data: Any = None,
    ) -> None:
        """Schedule (or reschedule) a timer. `repeat`: {"every": "P1D"} or {"cron": "0 9 * * MON-FRI"},
        with optional "times", "until" (a datetime or RFC 3339 text) and "timezone"
        (docs/CONTRACT.md, Recurring timers). `data`: any JSON value, delivered in every
        DueTimeReached of the timer; None sends none (and a reschedule without it clears it)."""
        payload: dict[str, Any] = {
            "tenantId": tenant_id,
            "serviceCallId": service_call_id,
            "dueAt": iso(due_at),
        }
        if correlation_id is not None:
            payload["correlationId"] = correlation_id
        if repeat is not None:
            until = repeat.get("until")
            payload["repeat"] = {**repeat, "until": iso(until)} if isinstance(until, datetime) else repeat
        if data is not None:
            payload["data"] = data
        await self._send(self.subjects.schedule(_tenant(tenant_id)), "ScheduleTimer", payload, correlation_id)

    async def cancel(self, tenant_id: str, service_call_id: str) -> None:
        payload = {"tenantId": tenant_id, "serviceCallId": service_call_id}
        await self._send(self.subjects.cancel(_tenant(tenant_id)), "CancelTimer", payload, None)

    async def get(self, tenant_id: str, service_call_id: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """The timer's read model, or None when the service knows no such timer."""
        body = json.dumps({"serviceCallId": service_call_id}).encode()
        reply = await self.nc.request(self.subjects.get(_tenant(tenant_id)), body, timeout=timeout)
        view: dict[str, Any] = json.loads(reply.data)
        if view.get("error") == "not_found":
            return None
        if "error" in view:
            raise RuntimeError(f"{view['error']}: {view.get('detail', '')}")
        return view

    async def _send(
        self, subject: str, kind: str, payload: dict[str, Any], correlation_id: str | None
    ) -> None:
        envelope = {
            "id": str(uuid.uuid4()),
            "type": kind,
            "tenantId": payload["tenantId"],
            "correlationId": correlation_id,
            "timestampMs": time.time_ns() // 1_000_000,
            "payload": payload,
        }
        # The envelope id as Nats-Msg-Id: a retried publish of this same command is dropped.
        await self.js.publish(subject, json.dumps(envelope).encode(), headers={"Nats-Msg-Id": envelope["id"]})

    async def close(self) -> None:
        if self._owns:
            await self.nc.drain()

    async def __aenter__(self) -> TimerClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _tenant(tenant_id: str) -> str:
    # Whitelisted, never escaped: a tenant can only ever address its own subjects.
    if not TENANT_RE.match(tenant_id):
        raise ValueError(f"tenantId must match {TENANT_RE.pattern}: {tenant_id!r}")
    return tenant_id
