"""A small client for producers: schedule, cancel and get timers without writing subjects by hand.

    async with await TimerClient.connect("nats://127.0.0.1:4222") as timers:
        await timers.schedule("acme", "sc-42", datetime(2026, 11, 22, 9, tzinfo=UTC))
        print(await timers.get("acme", "sc-42"))

`schedule` and `cancel` return once JetStream has stored the command: from then on it is the
service's job. Commands carry `timestampMs`, so an older command never overwrites a newer one.
`schedule_many` and `cancel_many` send many in JetStream batches (tens of thousands a second
instead of one per round trip: fast-ingest batches where the command stream takes them and its
durability allows, see `fast_ingest`, else atomic ones) and say for each whether it was stored. `due_events`
consumes DueTimeReached events, acknowledged in batches.
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

# Atomic or fast batches of commands awaiting their PubAck at once: enough to keep the server busy while
# the next one is sent, few enough to keep a slow server's backlog small.
BATCHES_IN_FLIGHT = 4
# One-by-one publishes awaiting their PubAck at once (a stream without allow_atomic, a batch
# refused for a duplicate id).
SINGLES_IN_FLIGHT = 256


FastIngest = Literal["auto", "on", "off"]
Labels = Mapping[str, str] | None  # a timer's labels, or a selector of a cancel, pause or resume
Kind = Literal["cancel", "pause", "resume"]


class TimerClient:
    """`fast_ingest`: how schedule_many and cancel_many batch (docs/CONTRACT.md, Producers).
    "auto": fast-ingest batches when the command stream has allow_batched (nats-server 2.14+)
    and is replicated, or the service measured them the cheaper on this server (its probe stream's
    metadata), else atomic batches. A fast batch stores each command as it comes: on a single
    server under `sync_interval: always` that is an fsync per command where an atomic batch has
    one per batch, so there auto keeps atomic batches. "on": fast wherever the stream takes them;
    "off": always atomic."""

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
        self._atomic = True  # until the command stream says it takes no atomic batches
        self._fast_ingest = fast_ingest
        self._fast: bool | None = None  # fast batches: decided on the first bulk send
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
        # Never in clear when TLS is configured (see wire.nats_connect).
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
        """Schedule (or reschedule) a timer. `repeat`: {"every": "P1D"} or {"cron": "0 9 * * MON-FRI"},
        with optional "times", "until" (a datetime or RFC 3339 text) and "timezone"
        (docs/CONTRACT.md, Recurring timers). `data`: any JSON value, delivered in every
        DueTimeReached of the timer; None sends none (and a reschedule without it clears it).
        `labels`: string pairs the timer carries (shown by get, in its events; a bulk cancel, pause
        or resume selects by them: docs/CONTRACT.md, Labels); replaced like `data`.
        `headers`: NATS headers sent with the command (a `traceparent`, producer headers named in
        TIMER_CARRY_HEADERS), carried into its DueTimeReached events; a reschedule without them
        clears them, as with `data`. `window` and `expire_after`: an ISO 8601 duration ("PT10M") or a
        timedelta (docs/CONTRACT.md, Firing window, Expiry)."""
        payload = schedule_payload(tenant_id, service_call_id, due_at, correlation_id, repeat, data)
        payload |= spans(window=window, expireAfter=expire_after)
        payload |= {"labels": dict(labels)} if labels else {}
        subject = self.subjects.of(_tenant(tenant_id), "schedule")
        await self._send(subject, "ScheduleTimer", payload, correlation_id, headers)

    async def cancel(
        self, tenant_id: str, service_call_id: str | None = None, *, labels: Labels = None
    ) -> None:
        """Cancel the timer, or (`labels` instead) every pending timer of the tenant carrying all
        of those pairs (docs/CONTRACT.md, Labels)."""
        if service_call_id is None and not labels:
            raise ValueError("cancel: name a serviceCallId or labels")
        await self._control("cancel", tenant_id, service_call_id, labels)

    async def pause(
        self, tenant_id: str, service_call_id: str | None = None, *, labels: Labels = None
    ) -> None:
        """Pause every timer of the tenant, or only the one named, or those carrying all of `labels`
        (docs/USING.md, Pause and resume): they stay Scheduled (read model: paused) and do not fire
        until resumed."""
        await self._control("pause", tenant_id, service_call_id, labels)

    async def resume(
        self, tenant_id: str, service_call_id: str | None = None, *, labels: Labels = None
    ) -> None:
        """Resume the tenant, or the one timer paused by itself, or those carrying all of `labels`:
        what came due meanwhile fires, late."""
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
        """The timer's read model, or None when the service knows no such timer; else GetTimeout,
        NoReplica or GetRefused, each a TimerClientError (worker/client/errors.py)."""
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
        # The envelope id as Nats-Msg-Id, set last: a retried publish of this same command is dropped.
        sent = {**trace_headers(headers), **(headers or {}), "Nats-Msg-Id": command.id}
        await self.js.publish(subject, command.body, headers=sent)

    async def schedule_many(self, timers: Iterable[Mapping[str, Any]], timeout: float = 10.0) -> list[Sent]:
        """Send many ScheduleTimer commands, each a body as on the schedule subject
        (`{"tenantId", "serviceCallId", "dueAt", "correlationId"?, "repeat"?}`; `dueAt` a string
        or an aware datetime). For each, in order: accepted (stored), duplicate (JetStream had
        its id already) or error (not stored: send it again). Nothing is checked here but the
        tenant; a command the service rejects goes to the DLQ (worker.core.commands.parse_command
        checks as the service does). The commands of one call carry one `timestampMs`: they are
        issued together, and stream order settles ties (docs/CONTRACT.md, Ordering)."""
        return await self._many("schedule", "ScheduleTimer", timers, timeout)

    async def cancel_many(self, timers: Iterable[Mapping[str, Any]], timeout: float = 10.0) -> list[Sent]:
        """Send many CancelTimer commands (`{"tenantId", "serviceCallId"}` each); as schedule_many."""
        return await self._many("cancel", "CancelTimer", timers, timeout)

    async def send_many(
        self, commands: Sequence[Envelope], timeout: float = 10.0, *, fresh: bool = False
    ) -> list[Sent]:
        """Send commands built and checked already (a subject, an id sent as Nats-Msg-Id, a body
        each), byte for byte, in batches as schedule_many sends its own; what became of each, in
        order. `timer-service schedule --from-file` sends each line as the service's own check
        passed it. `fresh`: no id was ever sent before (see _send_many); by default an id may
        have been (a file imported again), and a PubAck says duplicate."""
        step = ATOMIC_BATCH_MAX
        parts = (commands[i : i + step] for i in range(0, len(commands), step))
        return await self._send_many(parts, timeout, fresh=fresh)

    def _commands(
        self, kind: Literal["schedule", "cancel"], type_: str, items: Iterable[Mapping[str, Any]]
    ) -> list[Envelope | str]:
        """The envelopes of one call, all at once (schedule_many builds them a batch at a time); in
        place of an item with a bad tenant, why it is not sent."""
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
        payloads = envelopes.payloads(items)  # a payload json.dumps refuses raises here: nothing sent
        step = ATOMIC_BATCH_MAX
        parts = (envelopes.part(payloads[i : i + step]) for i in range(0, len(payloads), step))
        return await self._send_many(parts, timeout)

    async def _send_many(
        self, parts: Iterable[Sequence[Envelope | str]], timeout: float, *, fresh: bool = True
    ) -> list[Sent]:
        """Send each part (its commands, and the reason in place of one not sent) as a batch,
        taking the next from `parts` (building it: most of the client's work) only once this one
        is on the wire, so the server stores one batch while the next is built; at most
        BATCHES_IN_FLIGHT batches await their PubAck.

        `fresh`: every id is new (uuid4s of Envelopes). Only then may fast batches carry them:
        a fast batch skips an id JetStream already has in silence, counted as stored, so an id
        sent before goes in an atomic batch, which is refused whole and then sent one by one,
        each PubAck saying duplicate or not."""
        results: list[Sent | None] = []
        traced = trace_headers()  # the caller's trace context, the same for every command of the call
        batches, singles = asyncio.Semaphore(BATCHES_IN_FLIGHT), asyncio.Semaphore(SINGLES_IN_FLIGHT)
        fast: bool | None = None  # decided on the first part of more than one command
        tasks: list[asyncio.Task[None]] = []

        async def one(i: int, c: Envelope) -> None:
            async with singles:
                try:
                    ack = await self.js.publish(
                        c.subject, c.body, timeout=timeout, headers={**traced, "Nats-Msg-Id": c.id}
                    )
                    results[i] = Sent(c.id, "duplicate" if ack.duplicate else "accepted")
                except Exception as exc:  # each command's own outcome; none ends the others
                    results[i] = Sent(c.id, "error", f"{type(exc).__name__}: {exc}")

        async def chunk(part: list[tuple[int, Envelope]], slot: bool) -> None:
            # `slot`: this part holds one of `batches`, given back once its batch is answered.
            try:
                if slot and fast and self._fast:
                    part, disabled = await self._fast_batches.send_part(
                        self.nc, part, results, timeout, traced
                    )
                    # The stream's owner took allow_batched away: atomic from now on.
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
                        self._atomic = False  # a command stream made before schedule_many
            finally:
                if slot:
                    batches.release()
            # Refused, lost or unanswered: one by one, with the same ids, so what the batch
            # stored after all is reported as a duplicate and stored once.
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
                    # Its first step publishes the batch; nats-py's flusher task then writes it.
                    await asyncio.sleep(0)
                    await written(self.nc)
        except BaseException:
            for t in tasks:
                t.cancel()
            raise
        await asyncio.gather(*tasks)
        return [r if r is not None else Sent("", "error", "not sent") for r in results]

    async def _fast_batched(self, subject: str) -> bool:
        """Whether bulk sends go in fast batches (see TimerClient): asked of the command stream
        once per client. A producer that may not read the stream's info keeps atomic batches."""
        if self._fast is None:
            self._fast = False
            if self._fast_ingest != "off" and server_has_fast_ingest(self.nc):
                try:
                    name = await self.js.find_stream_name_by_subject(subject)
                    config = (await self.js.stream_info(name)).config
                except Exception:  # no stream, no permission, a timeout: atomic batches as before
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
        """The tenant's DueTimeReached events, oldest first, from the durable consumer `durable`
        on `stream` (created when missing); consumer.py says how they are acknowledged.
        A tenant whose NATS permissions are docs/SECURITY.md's reads the consumer its operator
        provisioned (`timer-service consumer add --tenant <tenant>`, named after the tenant):
        only its info is asked, nothing is created."""
        return due_events(
            self.js,
            self.subjects.due(_tenant(tenant_id)),
            durable=durable,
            stream=stream,
            ack_every=ack_every,
            max_ack_pending=max_ack_pending,
        )

    async def close(self, timeout: float = 5.0) -> None:
        """Flush what was sent and close the connection this client opened, within `timeout`
        whatever the server does (closing.close_within: nats-py's drain waited 10 s more on a
        server that stopped answering, and a CLI command with it)."""
        if self._owns:
            await close_within(self.nc, timeout)

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
