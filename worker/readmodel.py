"""The read model: `<prefix>.<tenant>.timer.get` request/reply, tenant-scoped."""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any

from nats.aio.msg import Msg

from worker.contract import TENANT_RE, iso
from worker.errors import DatabaseError, TransientError
from worker.store import Store

log = logging.getLogger("worker.readmodel")


def timer_view(row: dict[str, Any]) -> dict[str, Any]:
    """A stored timer as the contract shows it (camelCase, RFC 3339 times)."""

    def t(value: datetime | None) -> str | None:
        return iso(value) if value is not None else None

    repeat = None
    if row["repeat_every"]:
        repeat = {
            "every": row["repeat_every"],
            "times": row["repeat_times"],
            "timezone": row["repeat_timezone"],
        }
    scheduled = row["state"] == "Scheduled"
    return {
        "tenantId": row["tenant_id"],
        "serviceCallId": row["service_call_id"],
        "state": row["state"],
        "dueAt": t(row["due_at"]),
        "nextOccurrence": t(row["due_at"]) if scheduled else None,
        "registeredAt": t(row["registered_at"]),
        "reachedAt": t(row["reached_at"]),
        "correlationId": row["correlation_id"],
        "occurrencesFired": row["fired_count"],
        "repeat": repeat,
        "attempts": row["attempts"],
        "lastError": row["last_error"],
    }


class ReadModel:
    def __init__(self, store: Store, prefix: str) -> None:
        self.store = store
        self.prefix = prefix

    async def answer(self, msg: Msg) -> None:
        reply = await self.lookup(msg.subject, msg.data)
        if msg.reply:
            await msg.respond(json.dumps(reply).encode())

    async def lookup(self, subject: str, data: bytes) -> dict[str, Any]:
        parts = subject.split(".")
        # The tenant comes from the subject the caller was allowed to publish on, never the body.
        if len(parts) != 4 or parts[0] != self.prefix or not TENANT_RE.match(parts[1]):
            return {"error": "bad_request", "detail": "subject is not <prefix>.<tenant>.timer.get"}
        try:
            body = json.loads(data)
            service_call_id = body["serviceCallId"]
            if not isinstance(service_call_id, str) or not service_call_id:
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            return {"error": "bad_request", "detail": 'body must be {"serviceCallId": "<id>"}'}
        try:
            row = await self.store.get(parts[1], service_call_id)
        except (TransientError, DatabaseError) as exc:
            log.warning("get failed", extra={"action": "get_failed", "error": str(exc)})
            return {"error": "unavailable", "detail": "the timer store is not reachable"}
        if row is None:
            return {"error": "not_found", "tenantId": parts[1], "serviceCallId": service_call_id}
        return timer_view(row)
