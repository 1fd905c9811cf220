"""The console's actions on a timer (only with TIMER_CONSOLE_ACTIONS): cancel, reschedule, fire
now. Each is sent as a producer sends it, a CancelTimer or a ScheduleTimer through the command
stream (worker/client.py), so every guarantee of the service holds for it: ordering, a claimed
occurrence left to fire, the DLQ for a command it would reject. Each is confirmed on a page of its
own first, and logged (`console_action`) with who did it."""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from worker.contract import TENANT_RE, Rejection, iso
from worker.core.commands import parse_command
from worker.ops import reads
from worker.ops.console.base import action_form, audit, console_of, field

WHAT = {
    "cancel": "Cancel",
    "reschedule": "Reschedule",
    "fire": "Fire now",
}
# How long a cancel waits for a replica to apply it before the timer's page is shown.
CANCEL_WAIT_S = 2.0


def _refuse(request: Request, status: int, tenant: str, sid: str, message: str) -> Response:
    return console_of(request).page(
        request, "confirm.html", status, what=None, tenant=tenant, sid=sid, error=message, fields={}
    )


async def timer_action(request: Request) -> Response:
    c = console_of(request)
    form = await action_form(request)
    what, tenant, sid = (request.path_params[k] for k in ("what", "tenant", "sid"))
    if what not in WHAT or not TENANT_RE.match(tenant):
        return Response("no such action", status_code=404)
    view = await c.db(reads.describe, tenant, sid)
    if view is None:
        return _refuse(request, 404, tenant, sid, f"there is no timer {sid} of {tenant}")
    due: datetime | None = None
    if what == "fire":
        due = datetime.now(UTC)
    elif what == "reschedule":
        try:
            due = datetime.fromisoformat(field(form, "dueAt"))
        except ValueError:
            return _refuse(request, 422, tenant, sid, "dueAt: an RFC 3339 time, e.g. 2030-01-01T09:00:00Z")
        if due.tzinfo is None:
            return _refuse(request, 422, tenant, sid, "dueAt: give the offset, e.g. Z for UTC")
    if due is not None and view["state"] == "Reached":
        return _refuse(
            request, 409, tenant, sid, "it has fired: Reached is final, a ScheduleTimer would be ignored"
        )
    payload = _schedule_payload(view, due) if due is not None else None
    if payload is not None:
        checked = parse_command(
            "schedule", tenant, _json(payload), now=datetime.now(UTC), max_horizon=c.s.max_horizon
        )
        if isinstance(checked, Rejection):
            return _refuse(
                request, 422, tenant, sid, f"the service would reject it: {checked.reason}: {checked.detail}"
            )
    if field(form, "confirm") != "yes":
        fields = {"dueAt": field(form, "dueAt")} if what == "reschedule" else {}
        return c.page(
            request, "confirm.html", what=what, label=WHAT[what], tenant=tenant, sid=sid, view=view,
            due=iso(due) if due and what != "fire" else None, error=None, fields=fields,
        )  # fmt: skip
    assert c.client is not None, "the console's lifespan connects to NATS"
    if payload is None:
        await c.client.cancel(tenant, sid)
        _, line = await run_in_threadpool(reads.cancel_outcome, c.conninfo, tenant, sid, CANCEL_WAIT_S, view)
        audit(request, what, tenant, sid, outcome=line)
    else:
        assert due is not None
        repeat = payload.get("repeat")
        await c.client.schedule(tenant, sid, due, correlation_id=payload.get("correlationId"), repeat=repeat)
        audit(request, what, tenant, sid, due_at=iso(due))
    # Post/redirect/get: reloading the timer's page sends nothing again.
    where = f"/timers/{_q(tenant)}/{_q(sid)}?done={what}"
    return RedirectResponse(where, status_code=303)


def _schedule_payload(view: dict[str, Any], due: datetime) -> dict[str, Any]:
    """The ScheduleTimer a producer would send to move this timer to `due`: its correlationId and
    repeat kept. A recurring timer counts its occurrences from the new dueAt (its anchor)."""
    payload: dict[str, Any] = {
        "tenantId": view["tenantId"],
        "serviceCallId": view["serviceCallId"],
        "dueAt": iso(due),
    }
    if view.get("correlationId") is not None:
        payload["correlationId"] = view["correlationId"]
    if view.get("repeat"):
        payload["repeat"] = {k: v for k, v in view["repeat"].items() if v is not None}
    return payload


def _json(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")
