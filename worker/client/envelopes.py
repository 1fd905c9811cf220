"""Command envelopes: one at a time, and in bulk, byte for byte what json.dumps makes."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from json.encoder import encode_basestring_ascii as _ascii
from typing import Any, Literal, NamedTuple

from worker.contract import TENANT_RE, Subjects, duration, iso


class Envelope(NamedTuple):  # a tuple: cheap to make in bulk
    subject: str
    id: str
    body: bytes


def envelope(subject: str, kind: str, payload: dict[str, Any], correlation_id: str | None) -> Envelope:
    body = {
        "id": str(uuid.uuid4()),
        "type": kind,
        "tenantId": payload["tenantId"],
        "correlationId": correlation_id,
        "timestampMs": time.time_ns() // 1_000_000,
        "payload": payload,
    }
    return Envelope(subject, body["id"], json.dumps(body).encode())


def schedule_payload(
    tenant_id: str,
    service_call_id: str,
    due_at: datetime,
    correlation_id: str | None,
    repeat: dict[str, Any] | None,
    data: Any,
) -> dict[str, Any]:
    """TimerClient.schedule's payload, `repeat.until` as RFC 3339."""
    payload: dict[str, Any] = {"tenantId": tenant_id, "serviceCallId": service_call_id, "dueAt": iso(due_at)}
    if correlation_id is not None:
        payload["correlationId"] = correlation_id
    if repeat is not None:
        until = repeat.get("until")
        payload["repeat"] = {**repeat, "until": iso(until)} if isinstance(until, datetime) else repeat
    if data is not None:
        payload["data"] = data
    return payload


def spans(**given: str | timedelta | None) -> dict[str, str]:
    """The durations given, as the contract writes them; those not given left out."""
    return {k: v if isinstance(v, str) else duration(v) for k, v in given.items() if v is not None}


class Envelopes:
    """One bulk call's envelopes: `payloads` checks and encodes them all before anything is sent,
    `part` gives a slice ids as its batch goes out."""

    def __init__(self, subjects: Subjects, kind: Literal["schedule", "cancel"], type_: str) -> None:
        self.subjects, self.kind, self.type = subjects, kind, json.dumps(type_)
        self.stamp = f', "timestampMs": {time.time_ns() // 1_000_000}, "payload": '
        # tenant -> its subject and envelope text from the id to correlationId
        self.tenants: dict[str, tuple[str, str]] = {}

    def payloads(self, items: Iterable[Mapping[str, Any]]) -> list[tuple[str, str, str] | str]:
        """Each item's subject, envelope text between id and payload, and payload JSON."""
        tenants, out = self.tenants, list[tuple[str, str, str] | str]()
        last_due, last_text = None, ""
        for item in items:
            tenant = item.get("tenantId")
            known = tenants.get(tenant) if isinstance(tenant, str) else None
            if known is None:
                if not isinstance(tenant, str) or not TENANT_RE.match(tenant):
                    out.append(f"tenantId must match {TENANT_RE.pattern}: {tenant!r}")
                    continue
                middle = f'", "type": {self.type}, "tenantId": {json.dumps(tenant)}, "correlationId": '
                known = tenants[tenant] = (self.subjects.of(tenant, self.kind), middle)
            if isinstance(due := item.get("dueAt"), datetime):
                # Commands of a call often share a due time: its text is reused.
                if due is not last_due:
                    last_due, last_text = due, iso(due)
                item = {**item, "dueAt": last_text}  # the caller's item is left as it was
            correlation = item.get("correlationId")
            head = known[1] + (_ascii(correlation) if isinstance(correlation, str) else "null") + self.stamp
            out.append((known[0], head, payload_json(item)))
        return out

    def part(self, payloads: Sequence[tuple[str, str, str] | str]) -> list[Envelope | str]:
        out: list[Envelope | str] = []
        for id_, p in zip(uuid4s(len(payloads)), payloads, strict=True):
            if isinstance(p, str):
                out.append(p)
            else:
                subject, head, payload = p
                out.append(Envelope(subject, id_, f'{{"id": "{id_}{head}{payload}}}'.encode()))
        return out


def payload_json(payload: Mapping[str, Any]) -> str:
    """json.dumps(dict(payload)), byte for byte; text keys and values joined without its setup."""
    try:
        return "{" + ", ".join([_ascii(k) + ": " + _ascii(v) for k, v in payload.items()]) + "}"
    except TypeError:  # a key or value that is not text
        return json.dumps(payload if isinstance(payload, dict) else dict(payload))


# RFC 9562's variant bits (10): the hex digit they start, by the digit drawn.
_VARIANT = {d: "89ab"[int(d, 16) & 3] for d in "0123456789abcdef"}


def uuid4s(n: int) -> list[str]:
    """n str(uuid.uuid4())s from one os.urandom read."""
    h, v = os.urandom(16 * n).hex(), _VARIANT
    return [
        f"{h[i:j]}-{h[j : j + 4]}-4{h[j + 5 : j + 8]}-{v[h[j + 8]]}{h[j + 9 : j + 12]}-{h[j + 12 : j + 24]}"
        for i, j in zip(range(0, 32 * n, 32), range(8, 32 * n, 32), strict=True)
    ]
