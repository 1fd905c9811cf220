"""The validation boundary (docs/CONTRACT.md, Reason codes): command bytes in, a typed command or a
Rejection out. Total: for any bytes it returns one of the two and never raises. The fields themselves
are checked in fields.py. Unknown keys are ignored, for forward compatibility; a JSON null is an
absent field, and the envelope's value wins over the payload's."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar, get_args

from worker.contract import (
    COMMAND_TYPES,
    CONTROL_TYPES,
    DEFAULT_MAX_PAYLOAD_BYTES,
    INVALID_TENANT,
    MAX_BODY_BYTES,
    MAX_DETAIL_CHARS,
    TENANT_RULE,
    CancelTimer,
    Command,
    CommandKind,
    ControlKind,
    Kind,
    PauseTimers,
    Rejection,
    ScheduleTimer,
    is_valid_tenant,
)
from worker.core.domain import BulkAction, BulkKind
from worker.core.fields import (
    JsonObject,
    _correlation,
    _data,
    _due_at,
    _expire_after,
    _first_occurrence,
    _identifier,
    _json_type,
    _labels,
    _optional,
    _Reject,
    _repeat,
    _required,
    _show,
    _timestamp,
    _window,
)

T = TypeVar("T")
Parsed = Command | PauseTimers | BulkAction

# Every form a tenant sends, `<kind>.<form>`; each is checked in test_noisy_neighbour.py, so a new one
# without a case there fails a test.
Form = Literal[
    "schedule.once", "schedule.cron", "schedule.every", "schedule.data", "schedule.labels",
    "schedule.window", "schedule.expire_after",
    "cancel.id", "cancel.labels",
    "pause.id", "pause.labels", "pause.tenant",
    "resume.id", "resume.labels", "resume.tenant",
    "get",
]  # fmt: skip
FORMS: frozenset[Form] = frozenset(get_args(Form))
_BULK_FORMS: dict[BulkKind, Form] = {
    "cancel": "cancel.labels", "pause": "pause.labels", "resume": "resume.labels"
}  # fmt: skip
_CONTROL_FORMS: dict[tuple[bool, bool], Form] = {  # (resume, whole tenant)
    (False, False): "pause.id", (False, True): "pause.tenant",
    (True, False): "resume.id", (True, True): "resume.tenant",
}  # fmt: skip


def form_kind(form: Form) -> Kind:
    """The kind of subject a form is sent on."""
    kind: Kind = form.partition(".")[0]  # type: ignore[assignment]  # every Form starts with a Kind
    return kind


def forms_of(parsed: Parsed) -> frozenset[Form]:
    """The forms a validated command takes: a ScheduleTimer's timing and each option it carries."""
    if isinstance(parsed, BulkAction):
        return frozenset({_BULK_FORMS[parsed.kind]})
    if isinstance(parsed, PauseTimers):
        return frozenset({_CONTROL_FORMS[(parsed.resume, parsed.service_call_id is None)]})
    if isinstance(parsed, CancelTimer):
        return frozenset({"cancel.id"})
    repeat = parsed.repeat
    timing: Form = "schedule.once" if repeat is None else "schedule.cron" if repeat.cron else "schedule.every"
    options: dict[Form, object] = {
        "schedule.data": parsed.data,
        "schedule.labels": parsed.labels,
        "schedule.window": parsed.window,
        "schedule.expire_after": parsed.expire_after,
    }
    return frozenset({timing, *(form for form, value in options.items() if value is not None)})


def parse_command(
    kind: CommandKind,
    subject_tenant: str,
    body: bytes,
    *,
    now: datetime,
    max_horizon: timedelta,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
) -> Command | BulkAction | Rejection:
    """The command in `body`, received on `<prefix>.<subject_tenant>.timer.<kind>`, or why not."""
    token = subject_tenant if is_valid_tenant(subject_tenant) else INVALID_TENANT
    try:
        return _parse(kind, subject_tenant, body, now, max_horizon, max_payload_bytes)
    except _Reject as why:
        return Rejection(why.reason, _one_line(why.detail), token)


def _parse(
    kind: CommandKind,
    subject_tenant: str,
    body: bytes,
    now: datetime,
    max_horizon: timedelta,
    max_payload_bytes: int,
) -> Command | BulkAction:
    _check_envelope(body, subject_tenant)
    if kind not in COMMAND_TYPES:
        raise _Reject("unknown_type", f"no command is sent on the {_show(kind)} subject")
    fields, envelope = _unwrap(kind, _load(body))

    tenant = _tenant(fields, envelope, subject_tenant)
    correlation_id = _first(_correlation(envelope), _correlation(fields))
    timestamp_ms = _first(_timestamp(envelope), _timestamp(fields))
    if kind == "cancel" and (selector := _selector(fields, envelope)) is not None:
        return BulkAction(tenant, selector, "cancel", correlation_id, timestamp_ms)

    service_call_id = _identifier(
        _required(fields, "serviceCallId", str), "serviceCallId", "bad_service_call_id"
    )

    if kind == "cancel":
        return CancelTimer(tenant, service_call_id, correlation_id, timestamp_ms)
    due_at = _due_at(_required(fields, "dueAt", str))
    if due_at - now > max_horizon:
        raise _Reject("beyond_horizon", f"dueAt is more than {max_horizon} ahead")
    repeat = _repeat(fields.get("repeat"))
    if repeat is not None:
        due_at = _first_occurrence(repeat, due_at)
    data = _data(fields.get("data"), max_payload_bytes)
    window, expire_after = _window(fields.get("window")), _expire_after(fields.get("expireAfter"))
    labels = _labels(fields.get("labels"))
    return ScheduleTimer(
        tenant, service_call_id, due_at, correlation_id, timestamp_ms, repeat, data=data, window=window,
        expire_after=expire_after, labels=labels,
    )  # fmt: skip


def _selector(fields: JsonObject, envelope: JsonObject) -> dict[str, str] | None:
    """A `labels` selector instead of a serviceCallId: naming both, or one beside the payload, is
    refused."""
    if "labels" in envelope:
        raise _Reject("bad_labels", "labels belongs in the payload, not the envelope")
    if "labels" in fields and fields["labels"] is None and fields.get("serviceCallId") is None:
        raise _Reject("bad_labels", "labels is null: name the pairs, or leave it out")
    selector = _labels(fields.get("labels"), selector=True)
    if selector is not None and fields.get("serviceCallId") is not None:
        raise _Reject("bad_labels", "name serviceCallId or labels, not both")
    return selector


def parse_control(
    kind: ControlKind, subject_tenant: str, body: bytes
) -> PauseTimers | BulkAction | Rejection:
    """The PauseTimers or ResumeTimers in `body`, or why not; the same boundary as parse_command.
    Without a serviceCallId it acts on every timer of the tenant; a null one is refused, never
    widened."""
    token = subject_tenant if is_valid_tenant(subject_tenant) else INVALID_TENANT
    try:
        return _parse_control(kind, subject_tenant, body)
    except _Reject as why:
        return Rejection(why.reason, _one_line(why.detail), token)


def _parse_control(kind: ControlKind, subject_tenant: str, body: bytes) -> PauseTimers | BulkAction:
    _check_envelope(body, subject_tenant)
    if kind not in CONTROL_TYPES:
        raise _Reject("unknown_type", f"no command is sent on the {_show(kind)} subject")
    doc = _load(body)
    envelope: JsonObject = {}
    fields = doc
    if "payload" in doc or "type" in doc:
        name = _required(doc, "type", str)
        if name not in CONTROL_TYPES.values():
            raise _Reject("unknown_type", f"type {_show(name)} is not a pause or resume command")
        if name != CONTROL_TYPES[kind]:
            raise _Reject("type_mismatch", f"type {name} was sent on the {kind} subject")
        fields, envelope = _required(doc, "payload", dict), doc
    tenant = _tenant(fields, envelope, subject_tenant)
    correlation_id = _first(_correlation(envelope), _correlation(fields))
    if (selector := _selector(fields, envelope)) is not None:
        return BulkAction(tenant, selector, kind, correlation_id)
    # Only an absent serviceCallId means every timer: a null or misplaced one is refused, never widened.
    if "serviceCallId" in envelope:
        raise _Reject("bad_service_call_id", "serviceCallId belongs in the payload, not the envelope")
    if "serviceCallId" in fields and fields["serviceCallId"] is None:
        raise _Reject("bad_service_call_id", "serviceCallId is null (leave it out to pause every timer)")
    raw_id = _optional(fields, "serviceCallId", str)
    service_call_id = None if raw_id is None else _identifier(raw_id, "serviceCallId", "bad_service_call_id")
    return PauseTimers(tenant, service_call_id, kind == "resume", correlation_id)


def _load(body: bytes) -> JsonObject:
    try:
        text = body.decode("utf-8")  # strict: invalid bytes and encoded surrogates fail
    except UnicodeDecodeError as exc:
        raise _Reject("invalid_utf8", f"body is not UTF-8 (byte {exc.start})") from None
    try:
        doc = _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:
        raise _Reject("invalid_json", f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise _Reject("wrong_type", f"body must be a JSON object, not {_json_type(doc)}")
    return doc


def _unique_keys(pairs: list[tuple[str, Any]]) -> JsonObject:
    # Keys arrive unescaped ("a" and "\u0061" are one key).
    obj = dict(pairs)  # in C: the common case costs no Python loop per key
    if len(obj) == len(pairs):
        return obj
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise _Reject("duplicate_key", f"key {_show(key)} appears twice in one object")
        obj[key] = value
    return obj


def _no_constant(name: str) -> float:
    raise _Reject("non_finite_number", f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 parses to inf without spelling "Infinity"
        raise _Reject("non_finite_number", f"number {_show(text)} is out of range")
    return value


# Made once: json.loads with hooks builds a new decoder per call.
_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_keys, parse_constant=_no_constant, parse_float=_finite_float
)


def _unwrap(kind: CommandKind, doc: JsonObject) -> tuple[JsonObject, JsonObject]:
    """(the flat command, the envelope or {}). An envelope is told by its "payload" or "type"."""
    if "payload" not in doc and "type" not in doc:
        return doc, {}
    name = _required(doc, "type", str)
    if name not in COMMAND_TYPES.values():
        raise _Reject("unknown_type", f"type {_show(name)} is not a command")
    if name != COMMAND_TYPES[kind]:
        raise _Reject("type_mismatch", f"type {name} was sent on the {kind} subject")
    return _required(doc, "payload", dict), doc


def _first(outer: T | None, inner: T | None) -> T | None:
    return inner if outer is None else outer


def _one_line(detail: str) -> str:
    # Goes into a NATS header and a log line: printable ASCII only, bounded.
    clean = "".join(ch if " " <= ch <= "~" else "?" for ch in detail)
    return clean[:MAX_DETAIL_CHARS]


def _tenant(fields: dict[str, Any], envelope: dict[str, Any], subject_tenant: str) -> str:
    """The body's tenantId: valid, the subject's, and the envelope's when it names one."""
    tenant = _required(fields, "tenantId", str)
    if not is_valid_tenant(tenant):
        raise _Reject("bad_tenant", f"tenantId {_show(tenant)} does not match {TENANT_RULE}")
    if tenant != subject_tenant:
        raise _Reject("tenant_mismatch", f"tenantId {_show(tenant)} is not the subject's {subject_tenant}")
    outer_tenant = _optional(envelope, "tenantId", str)
    if outer_tenant is not None and outer_tenant != tenant:
        raise _Reject("tenant_mismatch", f"envelope tenantId {_show(outer_tenant)} is not the payload's")
    return tenant


def _check_envelope(body: bytes, subject_tenant: str) -> None:
    """Size first, before a byte is decoded, then the subject's tenant token."""
    if len(body) > MAX_BODY_BYTES:
        raise _Reject("body_too_large", f"body is {len(body)} bytes, more than {MAX_BODY_BYTES}")
    if not is_valid_tenant(subject_tenant):
        raise _Reject("bad_tenant", f"subject tenant {_show(subject_tenant)} does not match {TENANT_RULE}")
