"""The DLQ, for operators: list, show, replay and purge rejected commands (docs/CONTRACT.md, DLQ).

Entries are read by stream sequence (the JetStream message-get API, filtered by subject), so
nothing here creates a consumer or changes the stream except `replay` and `purge`, and those only
delete the entries they name.

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
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from worker.adapters.broker import connect_options
from worker.adapters.queries import QUERIES
from worker.config import Settings
from worker.contract import MessageIds, Rejection, Subjects
from worker.core.commands import parse_command
from worker.natsconn import nats_connect
from worker.ops.reads import connect

# An operator's listing reads at most this many entries before it stops and says where.
MAX_SCAN = 10_000


@dataclass(frozen=True, slots=True)
class DlqFilter:
    tenant: str | None = None
    reason: str | None = None
    since: datetime | None = None
    before: datetime | None = None

    def matches(self, e: DlqEntry) -> bool:
        if self.reason is not None and e.reason != self.reason:
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
            "time": self.time.isoformat() if self.time else None,
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


def read_fleet_secret(conninfo: str) -> bytes:
    """The fleet secret (sql/migrations/0005), on a one-off read-only connection."""
    with connect(conninfo) as conn:
        found = conn.execute(QUERIES["fleet_secret"]).fetchone()
    if found is None:
        raise ReplayRefused("the database has no fleet secret (table fleet_secret is empty)")
    return bytes(found[0])


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
            self._ids = MessageIds(await asyncio.to_thread(read_fleet_secret, url))
        return self._ids.derived(self.settings.dlq_stream, entry.seq, entry.time)

    def _subject(self, tenant: str | None) -> str:
        return self.subjects.dlq(tenant or "*")

    async def get(self, seq: int) -> DlqEntry | None:
        """The entry at this sequence, or None (never stored, replayed, purged or aged out)."""
        try:
            raw = await self.js._jsm.get_msg(self.settings.dlq_stream, seq=seq)
        except NotFoundError:
            return None
        return self._entry(raw)

    def _entry(self, raw: Any) -> DlqEntry | None:
        subject: str = raw.subject or ""
        where = self.subjects.split(subject)
        if where is None or where[1] != "dlq":
            return None  # not a DLQ copy of this service (another prefix sharing the stream)
        headers = {str(k): str(v) for k, v in (raw.headers or {}).items()}
        return DlqEntry(
            seq=raw.seq,
            tenant=where[0],
            time=raw.time,
            reason=headers.get("Timer-Error", ""),
            detail=headers.get("Timer-Error-Detail", ""),
            original_subject=headers.get("Timer-Subject", ""),
            headers=headers,
            body=raw.data or b"",
        )

    async def scan(self, f: DlqFilter, after: int = 0) -> AsyncIterator[tuple[int, DlqEntry | None]]:
        """(sequence, entry when it matches) for every entry after `after` on the filter's subject."""
        seq = after + 1
        while True:
            try:
                raw = await self.js._jsm.get_msg(
                    self.settings.dlq_stream, seq=seq, subject=self._subject(f.tenant), next=True
                )
            except NotFoundError:
                return
            entry = self._entry(raw)
            at = raw.seq or seq
            yield at, entry if entry is not None and f.matches(entry) else None
            seq = at + 1

    async def page(self, f: DlqFilter, after: int = 0, limit: int = 50, max_scan: int = MAX_SCAN) -> DlqPage:
        """Up to `limit` matching entries after sequence `after`, oldest first."""
        found: list[DlqEntry] = []
        scanned = 0
        async for seq, entry in self.scan(f, after):
            scanned += 1
            if entry is not None:
                found.append(entry)
            if len(found) == limit or scanned == max_scan:
                return DlqPage(found, seq)
        return DlqPage(found, None)

    def validated_replay(self, entry: DlqEntry, body: bytes | None) -> tuple[str, bytes]:
        """(subject, body) to replay, or ReplayRefused saying why not."""
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
            kind, tenant, data, now=datetime.now(UTC), max_horizon=self.settings.max_horizon
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
        if ack.stream != self.settings.command_stream:
            raise ReplayRefused(f"{subject} went to stream {ack.stream}, not {self.settings.command_stream}")
        with contextlib.suppress(NotFoundError):  # a concurrent replay deleted it first
            await self.js._jsm.delete_msg(self.settings.dlq_stream, seq)
        return Replayed(seq, subject, int(ack.seq), bool(ack.duplicate))

    async def purge(self, f: DlqFilter, *, confirmed: bool) -> list[int]:
        """The sequences of the matching entries; deleted only when `confirmed`."""
        matched = [seq async for seq, entry in self.scan(f) if entry is not None]
        if confirmed:
            for seq in matched:
                with contextlib.suppress(NotFoundError):
                    await self.js._jsm.delete_msg(self.settings.dlq_stream, seq)
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
    lines = [f"{'SEQ':>8} {'TIME':<26} {'TENANT':<16} {'REASON':<20} DETAIL"]
    for e in page.entries:
        when = e.time.isoformat(timespec="seconds") if e.time else "-"
        lines.append(f"{e.seq:>8} {when:<26} {e.tenant:<16} {e.reason:<20} {e.detail}")
    if page.next_seq is not None:
        lines.append(f"more: --after {page.next_seq}")
    return "\n".join(lines)


def render_entry(e: DlqEntry) -> str:
    lines = [f"seq        {e.seq}", f"time       {e.time.isoformat() if e.time else '-'}"]
    lines += [f"{k}: {v}" for k, v in e.headers.items()]
    text = e.body_text()
    lines.append("")
    lines.append(text if text is not None else f"(binary body, base64) {base64.b64encode(e.body).decode()}")
    return "\n".join(lines)
