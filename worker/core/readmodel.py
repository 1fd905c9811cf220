"""The read model: `<prefix>.<tenant>.timer.get` request/reply, tenant-scoped. Gets are queued in their
tenant's bounded line and served a batch per tenant in turn, so one tenant's flood costs its sender,
not everybody's gets."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any

from worker import metrics
from worker.contract import Subjects, is_valid_tenant, tenant_inbox
from worker.core.fields import identifier_problem
from worker.core.ports import TimerReader
from worker.core.received import Request
from worker.core.timers import timer_view
from worker.errors import verdict
from worker.logs import Throttled

log = logging.getLogger(__name__)

# A tenant's gets waiting on one replica, far above what a waiting client sends; past it the oldest go.
LINE_GETS = 1000
LINE_BYTES = 1 << 20
# A tenant's gets looked up in one query before the next tenant's turn.
BATCH = 32
UNAVAILABLE = {"error": "unavailable", "detail": "the timer store is not reachable"}

# Where a `get` may be answered: the service replies with its own permissions, so only to inboxes.
_INBOX = "_INBOX"
_SERVICE_IMPORT_REPLY = "_R_"


def answerable(tenant: str | None, reply: str) -> bool:
    """Whether a get of `tenant` (None: its subject names none) may be answered on `reply`."""
    first, dot, rest = reply.partition(".")
    return bool(dot and rest) and (
        first in (_INBOX, _SERVICE_IMPORT_REPLY) or (tenant is not None and first == tenant_inbox(tenant))
    )


class _Line:
    __slots__ = ("gets", "size")

    def __init__(self) -> None:
        self.gets: deque[Request] = deque()
        self.size = 0

    def add(self, msg: Request) -> None:
        self.gets.append(msg)
        self.size += len(msg.data)
        while len(self.gets) > LINE_GETS or self.size > LINE_BYTES:
            self.size -= len(self.gets.popleft().data)
            metrics.GET_REQUESTS_SHED.inc()

    def take(self, n: int) -> list[Request]:
        batch = [self.gets.popleft() for _ in range(min(n, len(self.gets)))]
        self.size -= sum(len(m.data) for m in batch)
        return batch


class ReadModel:
    def __init__(self, store: TimerReader, prefix: str) -> None:
        self.store = store
        self.subjects = Subjects(prefix)
        # The tenants with gets waiting (None: a subject naming none), in turn order.
        self._lines: dict[str | None, _Line] = {}
        self._serving: asyncio.Task[None] | None = None
        # Once per get when Postgres or NATS is away: throttled.
        self._failed = Throttled(log)
        self._refused = Throttled(log)
        self._unanswered = Throttled(log)

    async def receive(self, msg: Request) -> None:
        """The subscription's callback: cheap (the body is not read), so the connection goes on reading."""
        if not msg.reply:
            return
        tenant = self._tenant(msg.subject)
        if not answerable(tenant, msg.reply):
            metrics.GET_REPLIES_REFUSED.inc()
            return
        line = self._lines.get(tenant)
        if line is None:
            line = self._lines[tenant] = _Line()
        line.add(msg)
        if self._serving is None or self._serving.done():
            self._serving = asyncio.create_task(self._serve(), name="gets")

    async def drain(self) -> None:
        if self._serving is not None:
            await self._serving

    async def _serve(self) -> None:
        """Until no get waits: a batch of the first tenant's gets, then that tenant to the back. One
        task, so a tenant's gets are answered in order and take one pool connection at a time."""
        while self._lines:
            tenant = next(iter(self._lines))
            line = self._lines.pop(tenant)
            batch = line.take(BATCH)
            if line.gets:
                self._lines[tenant] = line
            try:
                await self._answer(tenant, batch)
            except Exception as exc:  # a bug answering one batch must not leave the rest waiting
                error = f"{type(exc).__name__}: {exc}"
                self._unanswered.warning("get not answered", {"action": "get_unanswered", "error": error})

    async def _answer(self, tenant: str | None, batch: list[Request]) -> None:
        asked = [self._service_call_id(tenant, msg.data) for msg in batch]
        ids = [x for x in asked if isinstance(x, str)]
        found = await self.lookup(tenant, ids) if tenant is not None and ids else {}
        for msg, x in zip(batch, asked, strict=True):
            answer = found[x] if isinstance(x, str) else x
            # UTF-8 as it is: ASCII escapes could make a reply outgrow the max_payload its events fit.
            await msg.respond(json.dumps(answer, ensure_ascii=False).encode())

    def _tenant(self, subject: str) -> str | None:
        """The tenant of a get's subject, never the body's, or None when it is not a get subject."""
        where = self.subjects.split(subject)
        return where[0] if where is not None and where[1] == "get" and is_valid_tenant(where[0]) else None

    @staticmethod
    def _service_call_id(tenant: str | None, data: bytes) -> str | dict[str, Any]:
        """The id a get asks for, or the answer to one that cannot be looked up."""
        if tenant is None:
            return {"error": "bad_request", "detail": "subject is not <prefix>.<tenant>.timer.get"}
        try:
            body = json.loads(data)
            service_call_id = body["serviceCallId"]
            if not isinstance(service_call_id, str) or not service_call_id:
                raise ValueError
        except (ValueError, KeyError, TypeError, RecursionError):
            return {"error": "bad_request", "detail": 'body must be {"serviceCallId": "<id>"}'}
        # An id no timer can have is the caller's mistake: bad_request, not retried, before any query.
        if (problem := identifier_problem(service_call_id, "serviceCallId")) is not None:
            return {"error": "bad_request", "detail": problem}
        return service_call_id

    async def lookup(self, tenant: str, ids: list[str]) -> dict[str, dict[str, Any]]:
        try:
            rows = await self.store.get_many(tenant, ids)
        except Exception as exc:
            if verdict(exc) != "alone":
                self._failed.warning("get failed", {"action": "get_failed", "error": str(exc)})
                return {i: UNAVAILABLE for i in ids}
            if len(ids) > 1:  # one request's values broke the lookup: each alone, so it alone fails
                return {i: answer for one in ids for i, answer in (await self.lookup(tenant, [one])).items()}
            self._refused.warning("get refused", {"action": "get_refused"}, exc_info=exc)
            return {ids[0]: {"error": "bad_request", "detail": "the request cannot be looked up"}}
        missing = {"error": "not_found", "tenantId": tenant}
        return {i: timer_view(rows[i]) if i in rows else {**missing, "serviceCallId": i} for i in ids}
