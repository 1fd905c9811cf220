"""The producer client's command envelopes (docs/CONTRACT.md, Commands), one at a time or a part of
a bulk call at once, and what became of each command of a bulk call: `TimerClient`'s. Imports only
the contract, as the client."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, NamedTuple

from worker.contract import TENANT_RE, Subjects, iso


@dataclasses.dataclass(frozen=True)
class Sent:
    """What became of one command of schedule_many or cancel_many."""

    id: str  # the envelope id, also its Nats-Msg-Id
    outcome: Literal["accepted", "duplicate", "error"]  # duplicate: JetStream already had this id
    error: str | None = None


class Envelope(NamedTuple):  # a tuple: schedule_many makes tens of thousands a second
    subject: str
    id: str
    body: bytes


def envelope(subject: str, kind: str, payload: dict[str, Any], correlation_id: str | None) -> Envelope:
    """One command's envelope."""
    body = {
        "id": str(uuid.uuid4()),
        "type": kind,
        "tenantId": payload["tenantId"],
        "correlationId": correlation_id,
        "timestampMs": time.time_ns() // 1_000_000,
        "payload": payload,
    }
    return Envelope(subject, body["id"], json.dumps(body).encode())


def envelopes(
    subjects: Subjects,
    kind: Literal["schedule", "cancel"],
    type_: str,
    items: Sequence[Mapping[str, Any]],
    stamp: str | None = None,
    tenants: dict[str, tuple[str, str]] | None = None,
) -> list[Envelope | Sent]:
    """The envelopes `envelope` makes, built for a part of a call at once: the per-command costs
    that are not the command's own (a clock read, a uuid4's system call, a tenant's check and
    subject) are paid once per call (`stamp`, `tenants`, given for each part) or per part. A
    tenant id no subject may carry is an error in its place."""
    payloads = [dict(t) for t in items]  # copies: dueAt is rewritten, the caller's is not
    ids = uuid4s(len(payloads))
    stamp = stamp or timestamp_text()
    # `tenants`: tenant -> its subject, and its envelope's text from the id to correlationId:
    # each tenant is checked once, and only the payload goes through json.dumps per command.
    tenants = {} if tenants is None else tenants
    dumps = json.dumps
    out: list[Envelope | Sent] = []
    for id_, payload in zip(ids, payloads, strict=True):
        tenant = payload.get("tenantId")
        known = tenants.get(tenant) if isinstance(tenant, str) else None
        if known is None:
            if not isinstance(tenant, str) or not TENANT_RE.match(tenant):
                out.append(Sent("", "error", f"tenantId must match {TENANT_RE.pattern}: {tenant!r}"))
                continue
            middle = f'", "type": {dumps(type_)}, "tenantId": {dumps(tenant)}, "correlationId": '
            known = tenants[tenant] = (subjects.of(tenant, kind), middle)
        subject, middle = known
        if isinstance(due := payload.get("dueAt"), datetime):
            payload["dueAt"] = iso(due)
        correlation = payload.get("correlationId")
        correlation_json = dumps(correlation) if isinstance(correlation, str) else "null"
        # Byte for byte what json.dumps makes of envelope()'s (tests/unit/test_client.py).
        body = f'{{"id": "{id_}{middle}{correlation_json}{stamp}{dumps(payload)}}}'
        out.append(Envelope(subject, id_, body.encode()))
    return out


def timestamp_text() -> str:
    """The envelope's text around its timestampMs: now, once for all the commands of a call."""
    return f', "timestampMs": {time.time_ns() // 1_000_000}, "payload": '


def uuid4s(n: int) -> list[str]:
    """n random UUIDs (version 4), as str(uuid.uuid4()) makes them, from one read of os.urandom
    for all n instead of one each: a third of the time per id."""
    hexes = os.urandom(16 * n).hex()
    variant = "89ab"  # RFC 9562: the two bits after the version's nibble are 10
    return [
        f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{variant[int(h[16], 16) & 3]}{h[17:20]}-{h[20:32]}"
        for h in (hexes[i : i + 32] for i in range(0, 32 * n, 32))
    ]
