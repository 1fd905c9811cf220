"""The DLQ, for operators: list, show, replay and purge rejected commands (docs/CONTRACT.md, DLQ).

One entry is read by its stream sequence (the JetStream message-get API). A listing reads the
entries in batches through an ephemeral consumer of its own, filtered to the DLQ subject (one
tenant's, or every tenant's), acknowledging nothing and deleted when the listing ends (the server
drops it a minute later if this process dies first): nothing here changes the stream except
`replay` and `purge`, and those only delete the entries they name.

Replay publishes the command (as stored, or an edited body) to its original subject, only ever
one of the entry's own tenant, with a Nats-Msg-Id made from the entry's stream, sequence and
time with the fleet secret (contract.MessageIds), and deletes the entry only after the command
stream acknowledged it. Run twice, or after a crash between the two steps, the command stream
drops the second copy within its duplicate window; and a command applied twice changes nothing
more (commands are idempotent: docs/CONTRACT.md, Duplicates). No tenant can work the id out and
send it first to make the replay vanish, and a recreated DLQ stream's entries get ids of their own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from worker.adapters.jetstream.options import connect_options
from worker.adapters.jetstream.streams import command_stream_now
from worker.adapters.postgres import db
from worker.client.wire import nats_connect
from worker.config import Settings
from worker.contract import MessageIds, Rejection, Subjects
from worker.core.commands import parse_command
from worker.core.received import stored_time
from worker.errors import DatabaseError
from worker.ops.reads import fmt_time

# An operator's listing reads at most this many entries before it stops and says where.
MAX_SCAN = 10_000
# Entries fetched per request while listing.
SCAN_BATCH = 256


def command_key(body: bytes) -> tuple[str, str] | None:
    """(tenantId, serviceCallId) a stored command names (plain or envelope form), if it can be read."""
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        doc = json.loads(body)
        payload = doc.get("payload") if isinstance(doc.get("payload"), dict) else doc
        tenant, sid = doc.get("tenantId") or payload.get("tenantId"), payload.get("serviceCallId")
        if isinstance(tenant, str) and isinstance(sid, str):
            return tenant, sid
    return None


@dataclass(frozen=True, slots=True)
class DlqFilter:
    tenant: str | None = None
    reason: str | None = None
    since: datetime | None = None
    before: datetime | None = None
    service_call_id: str | None = None

    def matches(self, e: DlqEntry) -> bool:
        if self.reason is not None and e.reason != self.reason:
            return False
        if self.service_call_id is not None and e.service_call_id != self.service_call_id:
            return False
        if self.since is not None and (e.time is None or e.time < self.since):
            return False
        return not (self.before is not None and (e.time is None or e.time >= self.before))


@dataclass(frozen=True, slots=True)
class DlqEntry:
    seq: int
    tenant: str
    time: datetime | None
    reason: str
    detail: str
    original_subject: str
    headers: dict[str, str]
    body: bytes

    @property
    def service_call_id(self) -> str | None:
        """The serviceCallId the rejected command names, when its body can be read."""
        key = command_key(self.body)
        return key[1] if key else None

    @property
    def truncated(self) -> bool:
        return "Timer-Body-Truncated" in self.headers

    def body_text(self) -> str | None:
        try:
            return self.body.decode()
        except UnicodeDecodeError:
            return None

    def as_dict(self, with_body: bool = True) -> dict[str, Any]:
        d: dict[str, Any] = {
            "seq": self.seq,
            "tenant": self.tenant,
            "serviceCallId": self.service_call_id,
            "time": fmt_time(self.time),
            "reason": self.reason,
            "detail": self.detail,
            "subject": self.original_subject,
            "headers": self.headers,
        }
        if with_body:
            text = self.body_text()
            d["body"] = text if text is not None else None
            if text is None:
                d["bodyBase64"] = base64.b64encode(self.body).decode()
        return d


@dataclass(frozen=True, slots=True)
class DlqPage:
    entries: list[DlqEntry]
    next_seq: int | None  # where to go on from (--after), None at the end of the stream


@dataclass(frozen=True, slots=True)
class Replayed:
    seq: int
    subject: str
    command_seq: int
    duplicate: bool  # the command stream had this replay already (a second run)


class ReplayRefused(Exception):
    """A replay that would only bounce back to the DLQ, or has nowhere to go; nothing was sent."""


class Dlq:
    def __init__(self, nc: NATS, settings: Settings) -> None:
        self.settings = settings
        self.js: JetStreamContext = nc.jetstream(timeout=5)
        self.subjects = Subjects(settings.subject_prefix)
        self._ids: MessageIds | None = None  # read from Postgres by the first replay only

    async def replay_id(self, entry: DlqEntry) -> str:
        """The Nats-Msg-Id a replay of this entry carries, whoever runs it and however often."""
        if entry.time is None:
            raise ReplayRefused(f"entry {entry.seq} has no stored time: its replay id cannot be made")
        if self._ids is None:
            url = self.settings.database_url.get_secret_value()
            try:
                self._ids = MessageIds(await asyncio.to_thread(db.fleet_secret, url))
            except DatabaseError as exc:  # nothing sent: a refusal, in the one line it is
                raise ReplayRefused(str(exc)) from exc
        return self._ids.derived(self.settings.dlq_stream, entry.seq, entry.time)

    def _subject(self, tenant: str | None) -> str:
        return self.subjects.of(tenant or "*", "dlq")

    async def get(self, seq: int) -> DlqEntry | None:
        """The entry at this sequence, or None (never stored, replayed, purged or aged out)."""
        if not 0 < seq < 2**64:  # JetStream's are 64-bit from 1: any other names nothing
            return None
        try:
            raw = await self.js.get_msg(self.settings.dlq_stream, seq=seq)
        except NotFoundError:
            return None
        return self._stored(raw)

    def _entry(
        self, seq: int, subject: str, time: datetime | None, headers: dict[str, str] | None, data: bytes
    ) -> DlqEntry | None:
        where = self.subjects.split(subject)
        if where is None or where[1] != "dlq":
            return None  # not a DLQ copy of this service (another prefix sharing the stream)
        fields = {str(k): str(v) for k, v in (headers or {}).items()}
        return DlqEntry(
            seq=seq,
            tenant=where[0],
            time=time,
            reason=fields.get("Timer-Error", ""),
            detail=fields.get("Timer-Error-Detail", ""),
            original_subject=fields.get("Timer-Subject", ""),
            headers=fields,
            body=data or b"",
        )

    def _stored(self, raw: api.RawStreamMsg) -> DlqEntry | None:  # raw.time: truncated to microseconds
        return self._entry(raw.seq or 0, raw.subject or "", raw.time, raw.headers, raw.data or b"")

    async def scan(self, f: DlqFilter, after: int = 0) -> AsyncGenerator[tuple[int, DlqEntry | None]]:
        """(sequence, entry when it matches) for every entry after `after` on the filter's subject,
        read SCAN_BATCH at a time."""
        subject, stream = self._subject(f.tenant), self.settings.dlq_stream
        name = f"dlq-scan-{uuid.uuid4().hex}"
        config = api.ConsumerConfig(
            name=name,
            filter_subject=subject,
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after + 1,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=60.0,  # seconds: the server's clean-up if we die before deleting it
            mem_storage=True,
            num_replicas=1,
        )
        try:
            info = await self.js.add_consumer(stream, config=config)
        except NotFoundError:
            return  # no DLQ stream yet: nothing was ever rejected
        try:
            sub = await self.js.pull_subscribe_bind(consumer=name, stream=stream)
            left = int(info.num_pending or 0)  # matching entries from the start sequence on
            while left > 0:
                try:
                    batch = await sub.fetch(min(SCAN_BATCH, left), timeout=5)
                except nats.errors.TimeoutError:
                    break  # entries deleted meanwhile (a concurrent purge or replay)
                for msg in batch:
                    meta = msg.metadata
                    seq = meta.sequence.stream
                    # truncated: as get_msg's time is, so a listed entry and a got one share a replay id
                    stored = stored_time(msg, truncated=True)
                    entry = self._entry(seq, msg.subject, stored, msg.headers, msg.data)
                    left = int(meta.num_pending)
                    yield seq, entry if entry is not None and f.matches(entry) else None
            await sub.unsubscribe()
        finally:
            with contextlib.suppress(NotFoundError):
                await self.js.delete_consumer(stream, name)

    async def page(self, f: DlqFilter, after: int = 0, limit: int = 50, max_scan: int = MAX_SCAN) -> DlqPage:
        """Up to `limit` matching entries after sequence `after`, oldest first."""
        found: list[DlqEntry] = []
        scanned = 0
        async with contextlib.aclosing(self.scan(f, after)) as entries:
            async for seq, entry in entries:
                scanned += 1
                if entry is not None:
                    found.append(entry)
                if len(found) == limit or scanned == max_scan:
                    return DlqPage(found, seq)
        return DlqPage(found, None)

    def validated_replay(self, entry: DlqEntry, body: bytes | None) -> tuple[str, bytes]:
        """(subject, body) to replay, or ReplayRefused saying why not."""
        if entry.reason == "expired":  # the firing replica's record (docs/CONTRACT.md, The DLQ)
            raise ReplayRefused(
                f"entry {entry.seq} is an occurrence that expired unfired (ExpiredOccurrence), not a "
                "command: there is nothing to replay; schedule the timer again to have it fire"
            )
        where = self.subjects.split(entry.original_subject)
        if where is None or (kind := where[1]) not in ("schedule", "cancel"):
            raise ReplayRefused(
                f"entry {entry.seq} was sent on {entry.original_subject!r}, not a command subject: "
                "there is nothing to replay it to"
            )
        if where[0] != entry.tenant:
            # Anyone who can add to a tenant's dlq subject can write any Timer-Subject: a replay
            # goes back to the entry's own tenant or nowhere.
            raise ReplayRefused(
                f"entry {entry.seq} is tenant {entry.tenant!r}'s but names {entry.original_subject!r}, "
                f"a subject of tenant {where[0]!r}: a replay only goes to the entry's own tenant"
            )
        if body is None and entry.truncated:
            raise ReplayRefused(f"entry {entry.seq}'s body was cut to fit the DLQ: give a fixed body")
        data = entry.body if body is None else body
        tenant = where[0]
        # The body's tenantId (an envelope's too) must be this tenant: tenant_mismatch otherwise.
        parsed = parse_command(
            kind,
            tenant,
            data,
            now=datetime.now(UTC),
            max_horizon=self.settings.max_horizon,
            max_payload_bytes=self.settings.max_payload_bytes,
        )
        if isinstance(parsed, Rejection):
            which = "the edited body" if body is not None else f"entry {entry.seq} as it is"
            raise ReplayRefused(f"{which} would be rejected again: {parsed.reason}: {parsed.detail}")
        return entry.original_subject, data

    async def replay(self, seq: int, body: bytes | None = None) -> Replayed | None:
        """Re-submit entry `seq` (or `body` in its place) to its subject; delete the entry once the
        command stream has it. None when there is no such entry (replayed or purged already)."""
        entry = await self.get(seq)
        if entry is None:
            return None
        subject, data = self.validated_replay(entry, body)
        ack = await self.js.publish(subject, data, headers={"Nats-Msg-Id": await self.replay_id(entry)})
        expected = await command_stream_now(self.js, self.settings)  # its successor after a cut-over
        if ack.stream != expected:
            raise ReplayRefused(f"{subject} went to stream {ack.stream}, not {expected}")
        with contextlib.suppress(NotFoundError):  # a concurrent replay deleted it first
            await self.js.delete_msg(self.settings.dlq_stream, seq)
        return Replayed(seq, subject, int(ack.seq), bool(ack.duplicate))

    async def purge(self, f: DlqFilter, *, confirmed: bool, upto: int | None = None) -> list[int]:
        """The sequences of the matching entries (up to sequence `upto`: those an operator was
        shown before confirming, not ones stored since); deleted only when `confirmed`."""
        async with contextlib.aclosing(self.scan(f)) as entries:
            matched = [
                seq async for seq, entry in entries if entry is not None and (upto is None or seq <= upto)
            ]
        if confirmed:
            for seq in matched:
                with contextlib.suppress(NotFoundError):
                    await self.js.delete_msg(self.settings.dlq_stream, seq)
        return matched


@contextlib.asynccontextmanager
async def open_dlq(settings: Settings, **overrides: Any) -> AsyncIterator[Dlq]:
    """A DLQ on its own NATS connection, closed on exit."""
    opts = connect_options(settings) | overrides
    nc = await nats_connect(opts.pop("servers"), **opts)
    try:
        yield Dlq(nc, settings)
    finally:
        await nc.close()


def render_entries(page: DlqPage) -> str:
    lines = [f"{'SEQ':>8} {'TIME':<24} {'TENANT':<16} {'SERVICE CALL ID':<24} {'REASON':<20} DETAIL"]
    for e in page.entries:
        sid = e.service_call_id or "-"
        when = fmt_time(e.time) or "-"
        lines.append(f"{e.seq:>8} {when:<24} {e.tenant:<16} {sid:<24} {e.reason:<20} {e.detail}")
    if page.next_seq is not None:
        lines.append(f"more: --after {page.next_seq}")
    return "\n".join(lines)


def render_entry(e: DlqEntry) -> str:
    lines = [f"seq        {e.seq}", f"time       {fmt_time(e.time) or '-'}"]
    lines += [f"{k}: {v}" for k, v in e.headers.items()]
    text = e.body_text()
    lines.append("")
    lines.append(text if text is not None else f"(binary body, base64) {base64.b64encode(e.body).decode()}")
    return "\n".join(lines)
