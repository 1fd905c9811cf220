"""The wire contract (docs/CONTRACT.md), shared by the service and the producer client.

Pure (standard library only) so `worker.client` imports it without the service's dependencies.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any, Literal, NamedTuple, Protocol, get_args

TENANT_RULE = "[A-Za-z0-9_-]{1,64}"
# `\Z`, not `$`: `$` also matches before a trailing newline.
TENANT_RE = re.compile(rf"{TENANT_RULE}\Z")
# Probe stream metadata, "on" or "off": which batches are cheaper here; fast_ingest="auto" follows it.
FAST_BATCHES = "timer-service.fast-batches"
INVALID_TENANT = "_invalid"

MAX_BODY_BYTES = 64 * 1024
MAX_ID_CHARS = 200
MAX_DETAIL_CHARS = 200
MAX_TIMESTAMP_MS = 2**63 - 1  # a Postgres bigint
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_CARRIED_VALUE_CHARS = 512
MAX_LABELS = 16
LABEL_KEY_RULE = "[a-z0-9_.-]{1,63}"
MAX_LABEL_VALUE_CHARS = 200
# The dueAt range every layer holds (JavaScript dates, Postgres, a datetime in any local zone).
EARLIEST_DUE_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_DUE_AT = datetime(9999, 12, 31, tzinfo=UTC)
DUE_AT_RANGE = f"{EARLIEST_DUE_AT:%Y-%m-%dT%H:%M:%SZ}..{LATEST_DUE_AT:%Y-%m-%dT%H:%M:%SZ}"

# Why a command is rejected (DLQ header `Timer-Error`; docs/CONTRACT.md, Reason codes).
Reason = Literal[
    "bad_subject",
    "body_too_large",
    "invalid_utf8",
    "invalid_json",
    "duplicate_key",
    "non_finite_number",
    "wrong_type",
    "missing_field",
    "unknown_type",
    "type_mismatch",
    "bad_tenant",
    "tenant_mismatch",
    "bad_service_call_id",
    "bad_correlation_id",
    "bad_timestamp",
    "bad_due_at",
    "beyond_horizon",
    "bad_repeat",
    "bad_window",
    "bad_expire_after",
    "unknown_timezone",
    "payload_too_large",
    "bad_data",  # a string jsonb cannot store (U+0000, a lone surrogate)
    "bad_labels",
    "quota_exceeded",
    "timer_stuck",
    "bulk_backlog",
    "expired",  # from the firing loop, no command
]
REASONS: frozenset[str] = frozenset(get_args(Reason))

CommandKind = Literal["schedule", "cancel"]
ControlKind = Literal["pause", "resume"]
Kind = Literal["schedule", "cancel", "pause", "resume", "due", "dlq", "get"]
COMMAND_TYPES: dict[CommandKind, str] = {"schedule": "ScheduleTimer", "cancel": "CancelTimer"}
CONTROL_TYPES: dict[ControlKind, str] = {"pause": "PauseTimers", "resume": "ResumeTimers"}


def is_valid_tenant(token: str) -> bool:
    return TENANT_RE.match(token) is not None


def tenant_inbox(tenant: str) -> str:
    """The inbox prefix a tenant connects with; only it may subscribe there (docs/SECURITY.md)."""
    return f"_INBOX_{tenant}"


@dataclass(frozen=True)
class Subjects:
    """Every subject of the contract; tenants are validated before here."""

    prefix: str

    def of(self, tenant: str, kind: Kind) -> str:
        return f"{self.prefix}.{tenant}.timer.{kind}"

    def due(self, tenant: str) -> str:
        return self.of(tenant, "due")

    def split(self, subject: str) -> tuple[str, Kind] | None:
        """(tenant token, kind), or None; the token is not checked."""
        parts = subject.split(".")
        if len(parts) != 4 or parts[0] != self.prefix or parts[2] != "timer":
            return None
        kind = _KINDS.get(parts[3])
        return None if kind is None else (parts[1], kind)

    @property
    def commands(self) -> list[str]:
        return [self.of("*", kind) for kind in ("schedule", "cancel", "pause", "resume")]

    @property
    def wake(self) -> str:
        """Core-NATS hint that a timer was stored close to now (not part of the contract)."""
        return f"{self.prefix}._timer.wake"

    @property
    def probe(self) -> str:
        """Not part of the contract: three tokens, where every tenant's subject has four."""
        return f"{self.prefix}._timer.probe"


_KINDS: dict[str, Kind] = {kind: kind for kind in get_args(Kind)}


@dataclass(frozen=True, slots=True)
class Repeat:
    """A ScheduleTimer's `repeat`, data only: the arithmetic is worker.core.recurrence."""

    every: str | None  # ISO 8601 duration as given; exactly one of every and cron is set
    times: int | None  # occurrences including the first; None = forever
    timezone: str | None
    cron: str | None = field(default=None, kw_only=True)
    until: datetime | None = field(default=None, kw_only=True)
    # Missed occurrences become "one" (None), "none" or "all".
    catchup: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    tenant_id: str
    service_call_id: str
    due_at: datetime  # UTC
    correlation_id: str | None
    timestamp_ms: int | None
    repeat: Repeat | None
    # Headers carried to every DueTimeReached of this timer, validated.
    carried: dict[str, str] | None = None
    data: Any = None
    window: str | None = None
    expire_after: str | None = None
    labels: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class CancelTimer:
    tenant_id: str
    service_call_id: str
    correlation_id: str | None
    timestamp_ms: int | None


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: Reason
    detail: str  # one ASCII line: safe to log and to put in a NATS header
    tenant_token: str

    @property
    def dlq_token(self) -> str:
        """A valid tenant or INVALID_TENANT, whoever built the Rejection."""
        return self.tenant_token if is_valid_tenant(self.tenant_token) else INVALID_TENANT


Command = ScheduleTimer | CancelTimer


@dataclass(frozen=True, slots=True)
class PauseTimers:
    """PauseTimers (resume False) or ResumeTimers (True): the tenant's timers, or only the one named."""

    tenant_id: str
    service_call_id: str | None  # None: every timer of the tenant
    resume: bool
    correlation_id: str | None = None


def iso(dt: datetime) -> str:
    """RFC 3339 in UTC with milliseconds, e.g. 2026-11-23T09:00:00.123Z."""
    # The cheapest formatting that also writes years below 1000 with four digits; one per event.
    u = dt if dt.tzinfo is UTC else dt.astimezone(UTC)
    return "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ" % (  # noqa: UP031
        u.year,
        u.month,
        u.day,
        u.hour,
        u.minute,
        u.second,
        u.microsecond // 1000,
    )


def duration(span: timedelta) -> str:
    """An ISO 8601 duration in seconds to the millisecond, as a `window` is written: PT0.25S."""
    ms = (span / timedelta(milliseconds=1)).__round__()
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    return f"{sign}PT{ms // 1000}S" if ms % 1000 == 0 else f"{sign}PT{ms // 1000}.{ms % 1000:03d}S"


def firing_id(tenant_id: str, service_call_id: str, due_at: datetime) -> str:
    """The envelope `id` of a firing's DueTimeReached; predictable, so never a Nats-Msg-Id."""
    # Half to even, as round(): the id must not move between releases.
    return f"{tenant_id}:{service_call_id}:{(due_at.timestamp() * 1000).__round__()}"


_SHA256_BLOCK = 64
_IPAD = bytes(b ^ 0x36 for b in range(256))  # HMAC's paddings, as translate tables
_OPAD = bytes(b ^ 0x5C for b in range(256))


class MessageIds:
    """Every Nats-Msg-Id the service sets: an HMAC of what it names, keyed with the fleet secret.

    A guessable id would let a tenant publish it first and make the real message vanish as a
    duplicate; keyed, it is the same on every replica and unknowable to tenants.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the fleet secret must be at least 16 bytes")
        # HMAC-SHA256 keyed once into its two states, copied per id: cheaper than hmac.HMAC.
        key = hashlib.sha256(secret).digest() if len(secret) > _SHA256_BLOCK else secret
        key = key.ljust(_SHA256_BLOCK, b"\0")
        self._inner = hashlib.sha256(key.translate(_IPAD))
        self._outer = hashlib.sha256(key.translate(_OPAD))

    def _id(self, text: str) -> str:
        inner = self._inner.copy()
        inner.update(text.encode())
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()[:32]

    def spread(self, tenant_id: str, service_call_id: str, due_at: datetime, window_ms: int) -> int:
        """0..window_ms: when in its window an occurrence fires, the same on every replica."""
        if window_ms <= 0:
            return 0
        digest = self._id(
            f"window\0{tenant_id}\0{service_call_id}\0{(due_at.timestamp() * 1000).__round__()}"
        )
        return int(digest, 16) % (window_ms + 1)

    def event(self, envelope_id: str) -> str:
        """The Nats-Msg-Id of the DueTimeReached whose envelope `id` (firing_id) this is."""
        return self._id(f"due\0{envelope_id}")

    def expired(self, envelope_id: str) -> str:
        """The Nats-Msg-Id of the DLQ entry of an occurrence that expired unpublished."""
        return self._id(f"expired\0{envelope_id}")

    def derived(self, stream: str, seq: int, stored: datetime) -> str:
        """The Nats-Msg-Id of a message made from a stored one: a redelivery's copy is a duplicate,
        a recreated stream's is not (it stores at other times)."""
        return self._id(f"from\0{stream}\0{seq}\0{stored.astimezone(UTC).isoformat()}")


class Outgoing(NamedTuple):
    """One message to publish; a NamedTuple because a frozen dataclass's __init__ is slower."""

    subject: str
    payload: bytes
    headers: dict[str, str]


class Occurrence(Protocol):
    """What a DueTimeReached event tells of the occurrence that fired."""

    @property
    def tenant_id(self) -> str: ...
    @property
    def service_call_id(self) -> str: ...
    @property
    def due_at(self) -> datetime: ...  # when it was planned to fire
    @property
    def nominal_due_at(self) -> datetime | None: ...  # with a window, its dueAt
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def carried(self) -> dict[str, str] | None: ...
    @property
    def data(self) -> str | None: ...  # jsonb's JSON text
    @property
    def labels(self) -> str | None: ...


def data_json(value: Any) -> str:
    """`data` as jsonb prints it, but for its numbers, to measure it as its events carry it."""
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False, allow_nan=False)


def headers_size(headers: dict[str, str]) -> int:
    """The bytes of a header block as NATS sends it; the server counts it against max_payload."""
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


def wire_size(out: Outgoing) -> int:
    """What `out` counts against the server's max_payload: its payload and its header block."""
    return len(out.payload) + headers_size(out.headers)


def due_event(timer: Occurrence, subject: str, reached: str, reached_ms: int, ids: MessageIds) -> Outgoing:
    """The DueTimeReached event for one occurrence, from a template: cheaper than json.dumps, and
    every string goes through the JSON string encoder."""
    # With a window, dueAt and id are the nominal occurrence's; plannedAt is when it fires.
    nominal = timer.nominal_due_at
    due, planned = (timer.due_at, "") if nominal is None else (nominal, f',"plannedAt":"{iso(timer.due_at)}"')
    event_id = firing_id(timer.tenant_id, timer.service_call_id, due)
    msg_id = ids.event(event_id)
    tenant = _json_str(timer.tenant_id)
    correlation = "null" if timer.correlation_id is None else _json_str(timer.correlation_id)
    body = (
        f'{{"id":{_json_str(event_id)},"type":"DueTimeReached","tenantId":{tenant},'
        f'"correlationId":{correlation},"timestampMs":{reached_ms},"payload":{{"tenantId":{tenant},'
        f'"serviceCallId":{_json_str(timer.service_call_id)},"dueAt":"{iso(due)}"{planned},'
        f'"reachedAt":"{reached}"}}'
    )
    # Spliced as stored: jsonb's text is always one valid JSON value.
    if timer.labels is not None:
        body += f',"labels":{timer.labels}'
    body += "}" if timer.data is None else f',"data":{timer.data}}}'
    headers = {"Nats-Msg-Id": msg_id} if timer.carried is None else {**timer.carried, "Nats-Msg-Id": msg_id}
    return Outgoing(subject, body.encode(), headers)
