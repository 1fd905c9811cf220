"""`schedule --from-file` and `cancel --from-file`: a file of commands, read a line at a time,
each line checked as a replica will check it and sent once as checked, in batches; the others
named by their line number and reason."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from worker.client.envelopes import Envelope
from worker.config import Settings
from worker.contract import (
    COMMAND_TYPES,
    INVALID_TENANT,
    MAX_BODY_BYTES,
    MAX_ID_CHARS,
    CommandKind,
    Rejection,
    Subjects,
    iso,
)
from worker.ops.cli_nats import _with_client
from worker.ops.cli_output import emit

# Lines read, checked and sent at a time: memory stays flat for any file.
IMPORT_CHUNK = 10_000
# An envelope line's `id` that can go as its Nats-Msg-Id (a NATS header value): printable ASCII.
_MSG_ID = re.compile(rf"[!-~]{{1,{MAX_ID_CHARS}}}\Z")
# What a replica may still reject a command for once JetStream stored it, as the example the
# line after `schedule` and `cancel` gives: a ScheduleTimer past its tenant's quota; a
# CancelTimer waiting behind an occurrence stuck in its firing.
AFTER_STORED = {"schedule": "quota_exceeded", "cancel": "timer_stuck"}


def applied_or_dlq(kind: CommandKind, applies: str, dlq_filter: str) -> str:
    """The line after what `schedule` or `cancel` sent: a replica applies it or rejects it, and
    where to look."""
    return (
        f"a replica applies {applies}, or rejects it to the DLQ ({AFTER_STORED[kind]}, say):"
        f" `timer-service dlq list {dlq_filter}`"
    )


def send_file(settings: Settings, args: argparse.Namespace, kind: CommandKind) -> int:
    """One command per line of `args.from_file` (- for stdin), in the flat or the envelope form
    (docs/CONTRACT.md), its tenant from its `tenantId`; for `cancel`, also a bare serviceCallId
    of `args.tenant`. Each line is sent once, as what the service's own check (parse_command,
    with TIMER_MAX_HORIZON and TIMER_MAX_PAYLOAD_BYTES) passed: an envelope as it is, its `id`
    as Nats-Msg-Id (a file sent again: JetStream drops what it has, reported duplicate); a flat
    line in an envelope with a new id and, unless it has its own, the run's timestampMs. A line
    the service would reject is reported with its number and reason, and not sent; the rest go
    with TimerClient.send_many. No line is held past MAX_BODY_BYTES. A progress line on stderr
    while it runs (on a terminal); a summary on stdout. Exit 1 if any line was rejected or not
    stored. Sent is not applied: a replica may still reject a line to the DLQ, which the
    summary names."""
    path: str = args.from_file
    stream = sys.stdin.buffer if path == "-" else Path(path).open("rb")  # noqa: SIM115  # closed below
    progress = Progress(Path(path).stat().st_size if path != "-" else None)
    counts = {"accepted": 0, "duplicate": 0, "error": 0, "rejected": 0}
    # Whatever a replica rejects of this run is in the DLQ from here on.
    started = datetime.now(UTC)
    stamp = time.time_ns() // 1_000_000  # the run's timestampMs, for flat lines without one
    own = LineForm(settings, kind, getattr(args, "tenant", None), stamp)

    def reject(number: int, why: str) -> None:
        counts["rejected"] += 1
        progress.clear()
        print(f"line {number}: {why}", file=sys.stderr)

    async def send(client: Any) -> None:
        chunk: list[tuple[int, Envelope]] = []
        fresh = True  # every id in the chunk new (flat lines'): it may go in fast batches
        for number, line, size in _lines(stream, MAX_BODY_BYTES):
            progress.read(size)
            if line is None:
                reject(number, f"body_too_large: more than {MAX_BODY_BYTES} bytes, not read")
                continue
            if not line.strip():
                continue
            command = own.command(line, client.subjects)
            if isinstance(command, str):
                reject(number, command)
                continue
            chunk.append((number, command[0]))
            fresh = fresh and command[1]
            if len(chunk) >= IMPORT_CHUNK:
                await flush(client, chunk, fresh)
                fresh = True
        await flush(client, chunk, fresh)

    async def flush(client: Any, chunk: list[tuple[int, Envelope]], fresh: bool) -> None:
        if not chunk:
            return
        sent = await client.send_many([c for _, c in chunk], fresh=fresh)
        for (number, _), one in zip(chunk, sent, strict=True):
            counts[one.outcome] += 1
            if one.outcome == "error":
                progress.clear()
                print(f"line {number}: not stored, send it again: {one.error}", file=sys.stderr)
        progress.sent(len(chunk))
        chunk.clear()

    try:
        asyncio.run(_with_client(settings, send))
    finally:
        stream.close()
        progress.clear()
    # "sent": stored in the command stream (TimerClient's `accepted`), not yet applied; "duplicate":
    # the stream had that command already; "rejected": refused here, not sent.
    dlq = f"--since {iso(started)}"
    text = (
        f"sent {counts['accepted']}, duplicate {counts['duplicate']},"
        f" rejected {counts['rejected']} (not sent), not stored {counts['error']}"
    )
    if counts["accepted"]:
        text += "\n" + applied_or_dlq(kind, "each shortly", dlq)
    data = {
        "sent": counts["accepted"],
        "duplicate": counts["duplicate"],
        "rejected": counts["rejected"],
        "not_stored": counts["error"],
        "dlq": f"timer-service dlq list {dlq}",
    }
    emit(args, data, text)
    return 1 if counts["rejected"] or counts["error"] else 0


def _lines(stream: BinaryIO, limit: int) -> Iterator[tuple[int, bytes | None, int]]:
    """Each line of `stream`: its number, its bytes (None for one longer than `limit`, skipped
    without ever holding more than `limit` bytes of it) and the bytes read for it."""
    for number in itertools.count(1):
        line = stream.readline(limit + 1)
        if not line:
            return
        if len(line) <= limit or line.endswith(b"\n"):
            yield number, line, len(line)
            continue
        size = len(line)
        while not line.endswith(b"\n"):  # the rest of it, a piece at a time, up to its end
            line = stream.readline(limit)
            if not line:
                break
            size += len(line)
        yield number, None, size


class LineForm:
    """How one run reads its lines: the command kind, the tenant of bare serviceCallIds
    (`cancel --tenant`), the limits a replica checks with, the run's timestampMs."""

    def __init__(self, settings: Settings, kind: CommandKind, tenant: str | None, stamp: int) -> None:
        self.settings, self.kind, self.tenant, self.stamp = settings, kind, tenant, stamp

    def command(self, line: bytes, subjects: Subjects) -> tuple[Envelope, bool] | str:
        """The command one line sends and whether its id is new (not the line's own), checked as
        a replica will check it; or why not. The bytes checked are the bytes sent: a flat line
        is checked inside its envelope."""
        from worker.core.commands import parse_command  # not loaded for the CLI's other commands

        body = line.strip()
        if self.kind == "cancel" and not body.startswith(b"{"):  # a bare serviceCallId
            if self.tenant is None:
                return "a bare serviceCallId needs --tenant (or a JSON line with its tenantId)"
            try:
                sid = body.decode()
            except UnicodeDecodeError:
                return "bad_service_call_id: not UTF-8"
            body = json.dumps({"tenantId": self.tenant, "serviceCallId": sid}).encode()
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None  # parse_command says what is wrong with it, in the service's words
        doc = doc if isinstance(doc, dict) else {}
        envelope = "payload" in doc or "type" in doc  # as the service tells the forms apart
        fields = doc.get("payload") if envelope else doc
        tenant = fields.get("tenantId") if isinstance(fields, dict) else None
        msg_id, new = str(uuid.uuid4()), True
        if envelope:
            own = doc.get("id")
            if isinstance(own, str) and _MSG_ID.match(own):
                msg_id, new = own, False
        elif isinstance(tenant, str) and isinstance(fields, dict):
            # The envelope the Python client sends; the payload the line's own bytes, so the
            # service checks these and nothing re-encoded (a key twice, say, is still refused).
            own_stamp = "" if fields.get("timestampMs") is not None else f', "timestampMs": {self.stamp}'
            head = (
                f'{{"id": "{msg_id}", "type": "{COMMAND_TYPES[self.kind]}",'
                f' "tenantId": {json.dumps(tenant)}{own_stamp}'
            )
            body = f'{head}, "payload": '.encode() + body + b"}"
        checked = parse_command(
            self.kind,
            tenant if isinstance(tenant, str) else INVALID_TENANT,
            body,
            now=datetime.now(UTC),
            max_horizon=self.settings.max_horizon,
            max_payload_bytes=self.settings.max_payload_bytes,
        )
        if isinstance(checked, Rejection):
            return f"{checked.reason}: {checked.detail}"
        assert isinstance(tenant, str)  # the check passed: the tenantId named the subject's tenant
        return Envelope(subjects.of(tenant, self.kind), msg_id, body), new


class Progress:
    """One line on stderr, rewritten at most 10 times a second, only on a terminal: bytes read
    of the file (when its size is known) and commands stored. Not worth a dependency."""

    def __init__(self, total: int | None) -> None:
        self.total, self.done, self.stored = total, 0, 0
        self.live = sys.stderr.isatty()
        self.shown_at = 0.0

    def read(self, n: int) -> None:
        self.done += n

    def sent(self, n: int) -> None:
        self.stored += n
        now = time.monotonic()
        if self.live and now - self.shown_at >= 0.1:
            self.shown_at = now
            share = f" {100 * self.done / self.total:5.1f}%" if self.total else ""
            print(f"\r{share} {self.stored:,} sent", end="", file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.live and self.shown_at:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self.shown_at = 0.0
