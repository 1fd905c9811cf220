"""The read model: `<prefix>.<tenant>.timer.get` request/reply, tenant-scoped."""

from __future__ import annotations

import json
import logging
from typing import Any

from worker.contract import Subjects, is_valid_tenant, timer_view
from worker.core.fields import identifier_problem
from worker.core.ports import TimerReader
from worker.core.received import Request
from worker.errors import verdict

log = logging.getLogger("worker.readmodel")


class ReadModel:
    def __init__(self, store: TimerReader, prefix: str) -> None:
        self.store = store
        self.subjects = Subjects(prefix)

    async def answer(self, msg: Request) -> None:
        reply = await self.lookup(msg.subject, msg.data)
        if msg.reply:
            # UTF-8 as it is, as in the events: ASCII escapes made a `data` of 2-byte characters three
            # times its size, so a reply could outgrow the max_payload its timer's events fit.
            await msg.respond(json.dumps(reply, ensure_ascii=False).encode())

    async def lookup(self, subject: str, data: bytes) -> dict[str, Any]:
        where = self.subjects.split(subject)
        # The tenant comes from the subject the caller was allowed to publish on, never the body.
        if where is None or where[1] != "get" or not is_valid_tenant(where[0]):
            return {"error": "bad_request", "detail": "subject is not <prefix>.<tenant>.timer.get"}
        tenant = where[0]
        try:
            body = json.loads(data)
            service_call_id = body["serviceCallId"]
            if not isinstance(service_call_id, str) or not service_call_id:
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            return {"error": "bad_request", "detail": 'body must be {"serviceCallId": "<id>"}'}
        # An id no timer can have (NUL, a lone surrogate, too long) is the caller's mistake, not
        # the store's: answered bad_request, which a client does not retry, before any query.
        if (problem := identifier_problem(service_call_id, "serviceCallId")) is not None:
            return {"error": "bad_request", "detail": problem}
        try:
            row = await self.store.get(tenant, service_call_id)
        except Exception as exc:
            if verdict(exc) == "alone":  # this request's values broke the lookup: it alone fails
                log.warning("get refused", extra={"action": "get_refused"}, exc_info=exc)
                return {"error": "bad_request", "detail": "the request cannot be looked up"}
            log.warning("get failed", extra={"action": "get_failed", "error": str(exc)})
            return {"error": "unavailable", "detail": "the timer store is not reachable"}
        if row is None:
            return {"error": "not_found", "tenantId": tenant, "serviceCallId": service_call_id}
        return timer_view(row)
