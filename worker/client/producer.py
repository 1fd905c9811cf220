"""A small client for producers: schedule, cancel and get timers without writing subjects by hand.

    async with await TimerClient.connect("nats://127.0.0.1:4222") as timers:
        await timers.schedule("acme", "sc-42", datetime(2026, 11, 22, 9, tzinfo=UTC))
        print(await timers.get("acme", "sc-42"))

A command returns once JetStream has stored it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Literal

import nats.errors
from nats.aio.client import Client as NATS

from worker.client.batches import (
    ATOMIC_BATCH_MAX,
    ERR_ATOMIC_DISABLED,
    FastBatches,
    Sent,
    send_atomic,
    server_has_fast_ingest,
    service_measured_fast,
)
from worker.client.closing import close_within
from worker.client.consumer import MAX_ACK_PENDING, DueEvent, due_events
from worker.client.envelopes import Envelope, Envelopes, envelope, schedule_payload, spans
from worker.client.errors import GetRefused, GetTimeout, NoReplica
from worker.client.tracecontext import trace_headers
from worker.client.wire import nats_connect, written
from worker.contract import COMMAND_TYPES, CONTROL_TYPES, TENANT_RE, Subjects

# Batches awaiting their PubAck at once: the server kept busy, a slow one's backlog small.
BATCHES_IN_FLIGHT = 4
# One-by-one publishes awaiting their PubAck at once.
SINGLES_IN_FLIGHT = 256


FastIngest = Literal["auto", "on", "off"]
Labels = Mapping[str, str] | None  # a timer's labels, or a selector of a cancel, pause or resume
Kind = Literal["cancel", "pause", "resume"]


class TimerClient:
    """`fast_ingest`: how bulk sends batch (docs/CONTRACT.md, Producers): "auto" fast-ingest when
    the stream allows it and is replicated or measured cheaper; "on" when it allows; "off" never."""

    def __init__(
        self,
        nc: NATS,
        prefix: str = "svc",
        *,
        owns_connection: bool = False,
        fast_ingest: FastIngest = "auto",
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.subjects = Subjects(prefix)
        self._owns = owns_connection
        self._atomic = True  # until the stream refuses atomic batches
        self._fast_ingest = fast_ingest
        self._fast: bool | None = None  # decided on the first bulk send
        self._fast_batches = FastBatches()

    @classmethod
    async def connect(
        cls,
        url: str = "nats://127.0.0.1:4222",
        prefix: str = "svc",
        *,
        fast_ingest: FastIngest = "auto",
        **options: Any,
    ) -> TimerClient:
        # Never in clear when TLS is configured.
        nc = await nats_connect(url, **options)
        return cls(nc, prefix, owns_connection=True, fast_ingest=fast_ingest)

    async def schedule(
        self,
        tenant_id: str,
        service_call_id: str,
        due_at: datetime,
        *,
        correlation_id: str | None = None,
        repeat: dict[str, Any] | None = None,
        data: Any = None,
        labels: Labels = None,
        headers: Mapping[str, str] | None = None,
        window: str | timedelta | None = None,
        expire_after: str | timedelta | None = None,
    ) -> None:
        """Schedule (or reschedule) a timer (docs/CONTRACT.md). `repeat`: {"every": "P1D"} or
        {"cron": ...}, optional "times", "until", "timezone". `data`, `labels` and `headers` are
        carried into its events; a reschedule without them clears them. `window`,
        `expire_after`: ISO 8601 durations or timedeltas."""
        payload = schedule_payload(tenant_id, service_call_id, due_at, correlation_id, repeat, data)
        payload |= spans(window=window, expireAfter=expire_after)
        payload |= {"labels": dict(labels)} if labels else {}
        subject = self.subjects.of(_tenant(tenant_id), "schedule")
        await self._send(subject, "ScheduleTimer", payload, correlation_id, headers)

    async def cancel(
        self, tenant_id: str, service_call_id: str | None = None, *, labels: Labels = None
    ) -> None:
        """Cancel the timer, or (`labels` instead) every pending timer carrying all of them."""
        if service_call_id is None and not labels:
            raise ValueError("cancel: name a serviceCallId or labels")
        await self._control("cancel", tenant_id, service_call_id, labels)

    async def pause(
        self, tenant_id: str, service_call_id: str | None = None, *, labels: Labels = None
    ) -> None:
        """Pause the tenant, or the one timer named, or those carrying all of `labels`: they do
        not fire until resumed (docs/USING.md)."""
        await self._control("pause", tenant_id, service_call_id, labels)

    async def resume(
        self, tenant_id: str, service_call_id: str | None = None, *, labels: Labels = None
    ) -> None:
        """Resume the tenant, or the one timer named, or those carrying all of `labels`: what came
        due meanwhile fires, late."""
        await self._control("resume", tenant_id, service_call_id, labels)

    async def _control(self, kind: Kind, tenant_id: str, service_call_id: str | None, labels: Labels) -> None:
        tenant = _tenant(tenant_id)
        if service_call_id is not None and labels:
            raise ValueError(f"{kind}: name a serviceCallId or labels, not both")
        named = {"serviceCallId": service_call_id} if service_call_id is not None else {}
        payload = {"tenantId": tenant_id, **named, **({"labels": dict(labels)} if labels else {})}
        name = COMMAND_TYPES["cancel"] if kind == "cancel" else CONTROL_TYPES[kind]
        await self._send(self.subjects.of(tenant, kind), name, payload, None)

    async def get(self, tenant_id: str, service_call_id: str, timeout: float = 5.0) -> dict[str, Any] | None:
        """The timer's read model, or None when unknown. Raises GetTimeout, NoReplica or
        GetRefused, each a TimerClientError."""
        body = json.dumps({"serviceCallId": service_call_id}).encode()
        try:
            reply = await self.nc.request(self.subjects.of(_tenant(tenant_id), "get"), body, timeout=timeout)
        except nats.errors.TimeoutError as exc:
            raise GetTimeout() from exc
        except nats.errors.NoRespondersError as exc:
            raise NoReplica() from exc
        view: dict[str, Any] = json.loads(reply.data)
        if view.get("error") == "not_found":
            return None
        if "error" in view:
            raise GetRefused(view["error"], view.get("detail", ""))
        return view

    async def _send(
        self,
        subject: str,
        kind: str,
        payload: dict[str, Any],
        correlation_id: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        command = envelope(subject, kind, payload, correlation_id)
        # Nats-Msg-Id set last: a retried publish of this command is dropped.
        sent = {**trace_headers(headers), **(headers or {}), "Nats-Msg-Id": command.id}
        await self.js.publish(subject, command.body, headers=sent)

    async def schedule_many(self, timers: Iterable[Mapping[str, Any]], timeout: float = 10.0) -> list[Sent]:
        """Send many ScheduleTimer bodies; for each, in order: accepted, duplicate or error (send
        it again). Only the tenant is checked here; the service dead-letters the rest."""
        return await self._many("schedule", "ScheduleTimer", timers, timeout)

    async def cancel_many(self, timers: Iterable[Mapping[str, Any]], timeout: float = 10.0) -> list[Sent]:
        """Send many CancelTimer bodies; as schedule_many."""
        return await self._many("cancel", "CancelTimer", timers, timeout)

    async def send_many(
        self, commands: Sequence[Envelope], timeout: float = 10.0, *, fresh: bool = False
    ) -> list[Sent]:
        """Send envelopes built already, as schedule_many. `fresh`: no id was ever sent before."""
        step = ATOMIC_BATCH_MAX
        parts = (commands[i : i + step] for i in range(0, len(commands), step))
        return await self._send_many(parts, timeout, fresh=fresh)

    def _commands(
        self, kind: Literal["schedule", "cancel"], type_: str, items: Iterable[Mapping[str, Any]]
    ) -> list[Envelope | str]:
        envelopes = Envelopes(self.subjects, kind, type_)
        return envelopes.part(envelopes.payloads(items))

    async def _many(
        self,
        kind: Literal["schedule", "cancel"],
        type_: str,
        items: Iterable[Mapping[str, Any]],
        timeout: float,
    ) -> list[Sent]:
        envelopes = Envelopes(self.subjects, kind, type_)
        payloads = envelopes.payloads(items)  # raises before anything is sent
        step = ATOMIC_BATCH_MAX
        parts = (envelopes.part(payloads[i : i + step]) for i in range(0, len(payloads), step))
        return await self._send_many(parts, timeout)

    async def _send_many(
        self, parts: Iterable[Sequence[Envelope | str]], timeout: float, *, fresh: bool = True
    ) -> list[Sent]:
        """Send each part as a batch, building the next once this one is on the wire. Only fresh
        ids go in fast batches, which skip a known id silently."""
        results: list[Sent | None] = []
        traced = trace_headers()
        batches, singles = asyncio.Semaphore(BATCHES_IN_FLIGHT), asyncio.Semaphore(SINGLES_IN_FLIGHT)
        fast: bool | None = None  # decided on the first part of several commands
        tasks: list[asyncio.Task[None]] = []

        async def one(i: int, c: Envelope) -> None:
            async with singles:
                try:
                    ack = await self.js.publish(
                        c.subject, c.body, timeout=timeout, headers={**traced, "Nats-Msg-Id": c.id}
                    )
                    results[i] = Sent(c.id, "duplicate" if ack.duplicate else "accepted")
                except Exception as exc:  # none ends the others
                    results[i] = Sent(c.id, "error", f"{type(exc).__name__}: {exc}")

        async def chunk(part: list[tuple[int, Envelope]], slot: bool) -> None:
            # `slot`: this part holds one of `batches`.
            try:
                if slot and fast and self._fast:
                    part, disabled = await self._fast_batches.send_part(
                        self.nc, part, results, timeout, traced
                    )
                    self._fast = self._fast and not disabled
                elif slot and self._atomic:
                    error = await send_atomic(
                        self.nc,
                        [(c.subject, c.body, {**traced, "Nats-Msg-Id": c.id}) for _, c in part],
                        timeout,
                    )
                    if error is None:
                        for i, c in part:
                            results[i] = Sent(c.id, "accepted")
                        return
                    if error.get("err_code") == ERR_ATOMIC_DISABLED:
                        self._atomic = False
            finally:
                if slot:
                    batches.release()
            # Refused or unanswered: one by one, same ids, so nothing is stored twice.
            await asyncio.gather(*(one(i, c) for i, c in part))

        try:
            for part in parts:
                base = len(results)
                results.extend(Sent("", "error", c) if isinstance(c, str) else None for c in part)
                todo = [(base + j, c) for j, c in enumerate(part) if isinstance(c, Envelope)]
                if fast is None and len(todo) > 1:
                    fast = fresh and await self._fast_batched(todo[0][1].subject)
                slot = len(todo) > 1 and (bool(fast and self._fast) or self._atomic)
                if slot:
                    await batches.acquire()
                if todo:
                    tasks.append(asyncio.create_task(chunk(todo, slot)))
                    # Let it publish, then have nats-py's flusher write it.
                    await asyncio.sleep(0)
                    await written(self.nc)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise
        await asyncio.gather(*tasks)
        return [r if r is not None else Sent("", "error", "not sent") for r in results]

    async def _fast_batched(self, subject: str) -> bool:
        """Whether bulk sends go in fast batches, asked of the stream once per client."""
        if self._fast is None:
            self._fast = False
            if self._fast_ingest != "off" and server_has_fast_ingest(self.nc):
                try:
                    name = await self.js.find_stream_name_by_subject(subject)
                    config = (await self.js.stream_info(name)).config
                except Exception:  # no stream, no permission, a timeout: atomic
                    return False
                replicated = (config.num_replicas or 1) > 1
                allowed = bool(getattr(config, "allow_batched", False))
                if allowed and (
                    self._fast_ingest == "on"
                    or replicated
                    or await service_measured_fast(self.js, self.subjects.probe)
                ):
                    await self._fast_batches.start(self.nc)
                    self._fast = True
        return self._fast

    def due_events(
        self,
        tenant_id: str,
        *,
        durable: str,
        stream: str = "TIMER_EVENTS",
        ack_every: int = 256,
        max_ack_pending: int = MAX_ACK_PENDING,
    ) -> AsyncGenerator[DueEvent, None]:
        """The tenant's DueTimeReached events from consumer `durable` on `stream` (consumer.py)."""
        return due_events(
            self.js,
            self.subjects.due(_tenant(tenant_id)),
            durable=durable,
            stream=stream,
            ack_every=ack_every,
            max_ack_pending=max_ack_pending,
        )

    async def close(self, timeout: float = 5.0) -> None:
        """Flush and close the connection this client opened, within `timeout`."""
        if self._owns:
            await close_within(self.nc, timeout)

    async def __aenter__(self) -> TimerClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def _tenant(tenant_id: str) -> str:
    # Whitelisted, never escaped: a tenant addresses only its own subjects.
    if not TENANT_RE.match(tenant_id):
        raise ValueError(f"tenantId must match {TENANT_RE.pattern}: {tenant_id!r}")
    return tenant_id
