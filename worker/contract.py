"""The wire contract (docs/CONTRACT.md; its schema: docs/asyncapi.yaml), shared by the service and
the producer client: subjects, commands, reason codes, limits, the DueTimeReached event and the
read model's view of a timer.

Pure: no I/O, no settings, nothing but the standard library, so `worker.client` can import it
without the service's dependencies (Postgres driver, settings, metrics). The validation boundary
that turns bytes into these commands is `worker.core.commands.parse_command`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from json.encoder import encode_basestring_ascii as _json_str  # C, when available
from typing import Any, Literal, NamedTuple, Protocol, get_args

# The tenant token of a subject (docs/CONTRACT.md, Limits).
TENANT_RULE = "[A-Za-z0-9_-]{1,64}"
# `\Z`, not `$`: `$` also matches before a trailing newline, and "acme\n" is no tenant.
TENANT_RE = re.compile(rf"{TENANT_RULE}\Z")
# The probe stream's metadata: "on" when fast-ingest batches measured the cheaper on this server
# (adapters/jetstream/probe.py), "off" when atomic ones; TimerClient's fast_ingest="auto" follows it.
FAST_BATCHES = "timer-service.fast-batches"
# The DLQ subject's token for a command whose subject tenant is no tenant.
INVALID_TENANT = "_invalid"

# Limits (docs/CONTRACT.md, Limits).
MAX_BODY_BYTES = 64 * 1024
MAX_ID_CHARS = 200  # serviceCallId, correlationId
MAX_DETAIL_CHARS = 200  # Timer-Error-Detail
MAX_TIMESTAMP_MS = 2**63 - 1  # stored in a Postgres bigint
# A ScheduleTimer's `data`, in UTF-8 as its events carry it (worker.core.fields._data): the default of
# TIMER_MAX_PAYLOAD_BYTES (worker/config.py), which may lower or raise it up to MAX_BODY_BYTES.
DEFAULT_MAX_PAYLOAD_BYTES = 16 * 1024
# Headers a ScheduleTimer may carry to its DueTimeReached events (docs/CONTRACT.md, Trace context):
# W3C trace context, and the producer headers TIMER_CARRY_HEADERS allows, each value at most this.
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_CARRIED_VALUE_CHARS = 512
# A timer's labels (docs/CONTRACT.md, Labels): at most MAX_LABELS pairs, each key LABEL_KEY_RULE,
# each value at most MAX_LABEL_VALUE_CHARS characters, none a control character or a surrogate.
MAX_LABELS = 16
LABEL_KEY_RULE = "[a-z0-9_.-]{1,63}"
MAX_LABEL_VALUE_CHARS = 200
# The dueAt range every layer holds: epoch-millisecond firing ids, JavaScript dates, Postgres,
# and a Python datetime in any local zone (UTC-12..+14). A ScheduleTimer outside it is rejected
# (bad_due_at); a recurring timer's occurrences end at its last one inside it.
EARLIEST_DUE_AT = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_DUE_AT = datetime(9999, 12, 31, tzinfo=UTC)
DUE_AT_RANGE = f"{EARLIEST_DUE_AT:%Y-%m-%dT%H:%M:%SZ}..{LATEST_DUE_AT:%Y-%m-%dT%H:%M:%SZ}"

# Why a command is rejected (DLQ header `Timer-Error`, metric label; docs/CONTRACT.md, Reason codes).
Reason = Literal[
    "bad_subject",  # from intake, not parse_command: a subject outside <prefix>.<tenant>.timer.<kind>
    "body_too_large",
    "invalid_utf8",
    "invalid_json",
    "duplicate_key",
    "non_finite_number",
    "wrong_type",
    "missing_field",
    "unknown_type",
    "type_mismatch",  # a known type on the other command's subject
    "bad_tenant",
    "tenant_mismatch",
    "bad_service_call_id",
    "bad_correlation_id",
    "bad_timestamp",
    "bad_due_at",  # also a dueAt outside EARLIEST_DUE_AT..LATEST_DUE_AT
    "beyond_horizon",
    "bad_repeat",  # also a bad repeat.cron or repeat.until; the detail names the field
    "bad_window",  # `window` is not an ISO 8601 duration of days to seconds, or longer than a day
    "bad_expire_after",  # `expireAfter`: as `window`, at least a second and at most a week
    "unknown_timezone",
    "payload_too_large",  # `data` is more than TIMER_MAX_PAYLOAD_BYTES as its events carry it
    "bad_data",  # `data` holds a string Postgres jsonb cannot store (U+0000, a lone surrogate)
    "bad_labels",  # `labels` (or a selector) breaks the rules of docs/CONTRACT.md, Labels
    "quota_exceeded",  # from intake, not parse_command: TIMER_TENANT_MAX_PENDING reached
    "timer_stuck",  # from intake: the timer's occurrence stayed claimed past TIMER_STUCK_AFTER
    "bulk_backlog",  # from intake: the bulk lane holds as many of the tenant's commands as it may
    "expired",  # from the firing loop, no command: an occurrence not published within expireAfter
]
REASONS: frozenset[str] = frozenset(get_args(Reason))

CommandKind = Literal["schedule", "cancel"]
# Pause and resume (docs/USING.md, Pause and resume): commands on the tenant's pause/resume subjects, for the
# whole tenant or one timer of it; parsed by worker.core.commands.parse_control.
ControlKind = Literal["pause", "resume"]
Kind = Literal["schedule", "cancel", "pause", "resume", "due", "dlq", "get"]
COMMAND_TYPES: dict[CommandKind, str] = {"schedule": "ScheduleTimer", "cancel": "CancelTimer"}
CONTROL_TYPES: dict[ControlKind, str] = {"pause": "PauseTimers", "resume": "ResumeTimers"}


def is_valid_tenant(token: str) -> bool:
    return TENANT_RE.match(token) is not None


def tenant_inbox(tenant: str) -> str:
    """The inbox prefix a tenant connects with (nats-py `inbox_prefix`): its replies, and its
    events' deliver subject, come under it, and only it may subscribe there (docs/SECURITY.md)."""
    return f"_INBOX_{tenant}"


@dataclass(frozen=True)
class Subjects:
    """Every subject of the contract (docs/CONTRACT.md, Subjects); tenants are validated before here."""

    prefix: str

    def of(self, tenant: str, kind: Kind) -> str:
        """`<prefix>.<tenant>.timer.<kind>`, the subject `split` reads back."""
        return f"{self.prefix}.{tenant}.timer.{kind}"

    def due(self, tenant: str) -> str:
        """A tenant's DueTimeReached subject, by name: the firing loop asks for one an event."""
        return self.of(tenant, "due")

    def split(self, subject: str) -> tuple[str, Kind] | None:
        """(tenant token, kind) of `<prefix>.<tenant>.timer.<kind>`, or None. The token is not
        checked: a caller that needs a tenant asks is_valid_tenant."""
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
        """The service's own measure of the server's batches (worker/adapters/jetstream/probe.py; not part
        of the contract); three tokens, where every tenant's subject has four."""
        return f"{self.prefix}._timer.probe"


_KINDS: dict[str, Kind] = {kind: kind for kind in get_args(Kind)}


@dataclass(frozen=True, slots=True)
class Repeat:
    """A ScheduleTimer's `repeat` (docs/CONTRACT.md), as validated by worker.core.fields. The
    data only: the arithmetic (and its isodate, no client's business) is worker.core.recurrence."""

    every: str | None  # the ISO 8601 duration as given (e.g. "PT1H", "P1D", "P1M", "P1Y"); or cron
    times: int | None  # total number of occurrences including the first; None = forever
    timezone: str | None  # IANA zone name, checked with load_zone
    # Exactly one of every and cron is set. Keyword-only: most repeats are `every` ones.
    cron: str | None = field(default=None, kw_only=True)  # five-field cron expression, as given
    until: datetime | None = field(default=None, kw_only=True)  # no occurrence after this instant (UTC)
    # What occurrences missed while no replica claimed them become: "one" (None), "none", "all".
    catchup: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    tenant_id: str
    service_call_id: str
    due_at: datetime  # timezone-aware, converted to UTC
    correlation_id: str | None
    timestamp_ms: int | None  # envelope timestampMs, when present
    repeat: Repeat | None
    # Headers carried to every DueTimeReached of this timer (traceparent, tracestate, allowed
    # producer headers), already validated; None when the command carried none.
    carried: dict[str, str] | None = None
    # The producer's opaque `data`, already validated and bounded; None when absent (or null).
    # Delivered in every DueTimeReached of the timer; a newer ScheduleTimer replaces it.
    data: Any = None
    # As given (docs/CONTRACT.md): `window` and `expireAfter` ISO 8601 durations, `labels` already
    # validated; None when absent. A newer ScheduleTimer replaces each, like `data`.
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
    detail: str  # one ASCII line, <= MAX_DETAIL_CHARS: safe to log and to put in a NATS header
    tenant_token: str  # the subject's tenant when valid, else INVALID_TENANT (see dlq_token)

    @property
    def dlq_token(self) -> str:
        """The tenant token of this command's DLQ subject: never anything but a valid tenant or
        INVALID_TENANT, whoever built the Rejection."""
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
    """RFC 3339 in UTC with milliseconds, e.g. 2026-11-23T09:00:00.123Z (docs/CONTRACT.md, DueTimeReached)."""
    # %-formatting of the fields: the firing path formats one per event, and this is the cheapest
    # way that also writes years below 1000 with four digits.
    # Times read from Postgres are already in UTC (the session's TimeZone, psycopg's timezone.utc):
    # astimezone returns them as they are, after a method call that the test skips.
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
    """An ISO 8601 duration in seconds to the millisecond, as a `window` is written: PT600S,
    PT0.25S (docs/CONTRACT.md, Firing window). The service refuses one under 0 or over a day."""
    ms = (span / timedelta(milliseconds=1)).__round__()
    sign, ms = ("-", -ms) if ms < 0 else ("", ms)
    return f"{sign}PT{ms // 1000}S" if ms % 1000 == 0 else f"{sign}PT{ms // 1000}.{ms % 1000:03d}S"


def firing_id(tenant_id: str, service_call_id: str, due_at: datetime) -> str:
    """One firing, one id: the envelope `id` of its DueTimeReached (docs/CONTRACT.md, Duplicates),
    by which consumers drop a re-publish. Public and predictable, so never a Nats-Msg-Id: that
    is MessageIds.event of it."""
    # float.__round__ is what round() calls (half to even, exactly as before: the id must not move
    # between releases), without the builtin's lookup: the firing path makes one per event.
    return f"{tenant_id}:{service_call_id}:{(due_at.timestamp() * 1000).__round__()}"


_SHA256_BLOCK = 64
_IPAD = bytes(b ^ 0x36 for b in range(256))  # XOR of each byte with HMAC's paddings, as translate tables
_OPAD = bytes(b ^ 0x5C for b in range(256))


class MessageIds:
    """Every Nats-Msg-Id the service sets, keyed with the fleet secret (sql/migrations/0005).

    JetStream drops a message whose Nats-Msg-Id the stream saw within its duplicate window,
    whoever sent the first one. An id anyone can work out (a firing's `<tenant>:<id>:<dueAt ms>`,
    a stream position) lets a tenant publish it first and make the real message vanish behind a
    successful PubAck, and a stream position repeats once its stream is recreated. So each id
    is an HMAC-SHA256 of what it names, cut to 128 bits: the same on every replica (a re-publish
    of one firing is still dropped), unknowable without the secret, which no tenant can read.
    A purpose tag keeps the kinds apart, so an id of one kind is never one of another.
    """

    __slots__ = ("_inner", "_outer")

    def __init__(self, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("the fleet secret must be at least 16 bytes")
        # HMAC-SHA256 (RFC 2104) keyed once into its two SHA-256 states: each id copies them. The
        # firing loop makes one per event, and hmac.HMAC's copy and hexdigest (Python wrappers,
        # an outer copy each) cost twice these two hashlib copies (tools/bench/micro.py).
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
        """Where in a firing window of `window_ms` the occurrence of this timer nominally due at
        `due_at` fires: 0..window_ms milliseconds after it, uniform over the window and the same
        on every replica (worker/core/window.py). Keyed, so no tenant can aim it."""
        if window_ms <= 0:
            return 0
        digest = self._id(
            f"window\0{tenant_id}\0{service_call_id}\0{(due_at.timestamp() * 1000).__round__()}"
        )
        # 128 bits modulo at most 86,400,001: a bias below 2^-100.
        return int(digest, 16) % (window_ms + 1)

    def event(self, envelope_id: str) -> str:
        """The Nats-Msg-Id of the DueTimeReached whose envelope `id` (firing_id) this is."""
        return self._id(f"due\0{envelope_id}")

    def expired(self, envelope_id: str) -> str:
        """The Nats-Msg-Id of the DLQ entry of the occurrence whose envelope `id` (firing_id) this
        is, when it expired unpublished: a re-publish of the entry is dropped as the event's is."""
        return self._id(f"expired\0{envelope_id}")

    def derived(self, stream: str, seq: int, stored: datetime) -> str:
        """The Nats-Msg-Id of a message made from the one stored at `seq` of `stream` at `stored`
        (a rejected command's DLQ copy; a DLQ entry's replay). A redelivery of that message has
        the same three, so its copy is dropped as a duplicate; a recreated stream numbers from 1
        again but stores at other times, so its messages' copies are new."""
        return self._id(f"from\0{stream}\0{seq}\0{stored.astimezone(UTC).isoformat()}")


class Outgoing(NamedTuple):
    """One message to publish: a DueTimeReached event or a DLQ copy.

    A NamedTuple, not a frozen dataclass (as Claimed, worker/core/domain.py): the firing loop makes
    one per event, and the dataclass's __init__ (object.__setattr__ per field) cost a seventh of
    due_event (tools/bench/micro.py)."""

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
    def due_at(self) -> datetime: ...  # when it was planned to fire: dueAt itself without a window
    @property
    def nominal_due_at(self) -> datetime | None: ...  # with a window, its dueAt; else None
    @property
    def correlation_id(self) -> str | None: ...
    @property
    def carried(self) -> dict[str, str] | None: ...
    @property
    def data(self) -> str | None: ...  # the stored `data` as JSON text (Postgres jsonb's), or None
    @property
    def labels(self) -> str | None: ...  # the stored labels as JSON text (jsonb's), or None


def data_json(value: Any) -> str:
    """`data` as its events carry it but for its numbers: Postgres jsonb prints a stored value with
    ", " and ": " between members, its strings escaped as here, its keys in another order (the same
    bytes), and every number in plain notation (worker.core.fields._data measures those)."""
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False, allow_nan=False)


def headers_size(headers: dict[str, str]) -> int:
    """The bytes of a header block as NATS sends it: "NATS/1.0\r\n", a "Name: value\r\n" line
    each, "\r\n" (a client strips names and values, so never fewer). The server holds the block
    and the payload together to its max_payload, where nats-py checks the payload alone."""
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


def wire_size(out: Outgoing) -> int:
    """What `out` counts against the server's max_payload: its payload and its header block."""
    return len(out.payload) + headers_size(out.headers)


def due_event(timer: Occurrence, subject: str, reached: str, reached_ms: int, ids: MessageIds) -> Outgoing:
    """The DueTimeReached event (docs/CONTRACT.md; its schema: docs/asyncapi.yaml) for one occurrence.

    Written from a template rather than json.dumps of a dict: the firing path builds one per
    timer, and json.dumps showed in its profile (docs/BENCHMARKS.md, "Where the time went", step
    3). Every string goes through the C JSON string encoder, so any id or correlation id is
    escaped exactly as json.dumps would.
    """
    # With a window, the event's dueAt and id are the nominal occurrence's, and plannedAt says
    # when it was planned to fire (docs/CONTRACT.md, DueTimeReached).
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
    # `labels` and `data` are spliced as stored: jsonb's text output is always one valid JSON value.
    if timer.labels is not None:
        body += f',"labels":{timer.labels}'
    body += "}" if timer.data is None else f',"data":{timer.data}}}'
    # The carried headers never hold Nats-Msg-Id (headers.carried_headers), and it is set last.
    headers = {"Nats-Msg-Id": msg_id} if timer.carried is None else {**timer.carried, "Nats-Msg-Id": msg_id}
    return Outgoing(subject, body.encode(), headers)
