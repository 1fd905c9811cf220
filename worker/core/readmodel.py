"""The read model: `<prefix>.<tenant>.timer.get` request/reply, tenant-scoped."""

from __future__ import annotations

import json
import logging
from typing import Any

from worker import metrics
from worker.contract import Subjects, is_valid_tenant, tenant_inbox, timer_view
from worker.core.fields import identifier_problem
from worker.core.ports import TimerReader
from worker.core.received import Request
from worker.errors import verdict

log = logging.getLogger("worker.readmodel")

# Where a `get` is answered: the first token of an inbox its requester may listen on. nats-py's and
# nats.go's default inbox, a tenant's own (docs/SECURITY.md, tenant_inbox), and the reply a
# NATS service import makes (`_R_.…`, an account per tenant). Whitelisted: the service answers with
# its own permissions (its whole prefix, the JetStream API) and a publisher's permissions do not
# limit the reply subject it names, so an answer sent wherever the request said let one tenant
# store its timer, `data` and all, in another's event stream, DLQ or commands, a message a request.
_INBOX = "_INBOX"
_SERVICE_IMPORT_REPLY = "_R_"


def answerable(tenant: str | None, reply: str) -> bool:
    """Whether a get of `tenant` (None: its subject names none) may be answered on `reply`."""
    first, dot, rest = reply.partition(".")
    return bool(dot and rest) and (
        first in (_INBOX, _SERVICE_IMPORT_REPLY) or (tenant is not None and first == tenant_inbox(tenant))
    )


class ReadModel:
    def __init__(self, store: TimerReader, prefix: str) -> None:
        self.store = store
        self.subjects = Subjects(prefix)

    async def answer(self, msg: Request) -> None:
        if not msg.reply:  # nobody to answer: no lookup either
            return
        tenant = self._tenant(msg.subject)
        if not answerable(tenant, msg.reply):
            metrics.GET_REPLIES_REFUSED.inc()
            return
        reply = await self.lookup(tenant, msg.data)
        # UTF-8 as it is, as in the events: ASCII escapes made a `data` of 2-byte characters three
        # times its size, so a reply could outgrow the max_payload its timer's events fit.
        await msg.respond(json.dumps(reply, ensure_ascii=False).encode())

    def _tenant(self, subject: str) -> str | None:
        """The tenant of a get's subject, or None when it is not `<prefix>.<tenant>.timer.get`.
        The tenant comes from the subject the caller was allowed to publish on, never the body."""
        where = self.subjects.split(subject)
        return where[0] if where is not None and where[1] == "get" and is_valid_tenant(where[0]) else None

    async def lookup(self, tenant: str | None, data: bytes) -> dict[str, Any]:
        """The answer to a get of `tenant` (None: its subject named none) with body `data`."""
        if tenant is None:
            return {"error": "bad_request", "detail": "subject is not <prefix>.<tenant>.timer.get"}
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
