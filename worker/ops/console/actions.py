"""The console's actions (only with TIMER_CONSOLE_ACTIONS): on a timer, cancel, reschedule, fire
now, pause and resume; on a tenant, pause and resume (the bulk actions on the timers a label
filter selects: bulk.py). Each is sent as a producer (or `timer-service
pause`) sends it, a CancelTimer, ScheduleTimer, PauseTimers or ResumeTimers through the command
stream (worker/client/), so every guarantee of the service holds for it: ordering, a claimed
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
    "pause": "Pause",
    "resume": "Resume",
}
# A tenant's actions (the tenant's page): every timer of it, as `timer-service pause --tenant`.
TENANT_WHAT = {"pause": "Pause", "resume": "Resume"}
# How long a cancel waits for a replica to apply it before the timer's page is shown.
CANCEL_WAIT_S = 2.0


def _refuse(request: Request, status: int, tenant: str, sid: str | None, message: str) -> Response:
    return console_of(request).page(
        request, "confirm.html", status, what=None, tenant=tenant, sid=sid, error=message, fields={}
    )


def _not_now(what: str, view: dict[str, Any]) -> str | None:
    """Why this action cannot apply to the timer as it stands, or None. The service would ignore
    such a command; the console says so instead of sending it."""
    if what in ("fire", "reschedule", "pause") and view["state"] in ("Reached", "Expired"):
        return f"it is {view['state']}, which is final: the command would be ignored"
    if what == "pause" and view["state"] != "Scheduled":
        return f"it is {view['state']}: only a Scheduled timer can be paused"
    if what == "pause" and view.get("pausedAt"):
        return "it is paused already (by itself)"
    if what == "resume" and not view.get("pausedAt"):
        if view.get("paused"):  # paused with its tenant only: its own resume would be ignored
            return "it is paused with its tenant, not by itself: resume the tenant"
        return "it is not paused"
    return None


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
    if (why := _not_now(what, view)) is not None:
        return _refuse(request, 409, tenant, sid, why)
    # Fire now means now: a reschedule keeps the timer's firing window, "fire now" sends none.
    payload = _schedule_payload(view, due, keep_window=what == "reschedule") if due is not None else None
    if payload is not None:
        checked = parse_command(
            "schedule", tenant, _json(payload), now=datetime.now(UTC), max_horizon=c.s.max_horizon,
            max_payload_bytes=c.s.max_payload_bytes,
        )  # fmt: skip
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
    if what == "cancel":
        await c.client.cancel(tenant, sid)
        done = await run_in_threadpool(reads.cancel_outcome, c.conninfo, tenant, sid, CANCEL_WAIT_S, view)
        line = done.line
        audit(request, what, tenant, sid, outcome=line)
    elif what in TENANT_WHAT:
        await (c.client.resume if what == "resume" else c.client.pause)(tenant, sid)
        audit(request, what, tenant, sid)
    else:
        assert due is not None and payload is not None
        await c.client.schedule(
            tenant, sid, due, correlation_id=payload.get("correlationId"), repeat=payload.get("repeat"),
            data=payload.get("data"), labels=payload.get("labels"), headers=view.get("carriedHeaders"),
            window=payload.get("window"), expire_after=payload.get("expireAfter"),
        )  # fmt: skip
        audit(request, what, tenant, sid, due_at=iso(due))
    # Post/redirect/get: reloading the timer's page sends nothing again.
    return RedirectResponse(f"/timers/{_q(tenant)}/{_q(sid)}?done={what}", status_code=303)


async def tenant_action(request: Request) -> Response:
    """Pause or resume every timer of a tenant: the PauseTimers or ResumeTimers `timer-service
    pause --tenant` sends; replicas apply it in chunks, the tenant's page shows it applied."""
    c = console_of(request)
    form = await action_form(request)
    what, tenant = request.path_params["what"], request.path_params["tenant"]
    if what not in TENANT_WHAT or not TENANT_RE.match(tenant):
        return Response("no such action", status_code=404)
    summary = await c.db(reads.tenant_summary, tenant)
    if what == "resume" and summary["tenant_paused_at"] is None:
        return _refuse(request, 409, tenant, None, f"{tenant} is not paused as a tenant")
    if field(form, "confirm") != "yes":
        return c.page(
            request, "confirm.html", what=what, label=TENANT_WHAT[what], tenant=tenant, sid=None,
            summary=summary, error=None, fields={},
        )  # fmt: skip
    assert c.client is not None, "the console's lifespan connects to NATS"
    await (c.client.resume if what == "resume" else c.client.pause)(tenant)
    audit(request, f"tenant_{what}", tenant, None)
    return RedirectResponse(f"/tenants/{_q(tenant)}?done={what}", status_code=303)


def _schedule_payload(view: dict[str, Any], due: datetime, keep_window: bool) -> dict[str, Any]:
    """The ScheduleTimer a producer would send to move this timer to `due`: its correlationId,
    repeat, data, labels and expireAfter kept (a ScheduleTimer without `data` or `labels` would
    clear them), and its
    firing window when `keep_window`. A recurring timer counts
    its occurrences from the new dueAt (its anchor). Its carried headers go as the command's
    headers (timer_action), where a producer sends them."""
    payload: dict[str, Any] = {
        "tenantId": view["tenantId"],
        "serviceCallId": view["serviceCallId"],
        "dueAt": iso(due),
    }
    if view.get("correlationId") is not None:
        payload["correlationId"] = view["correlationId"]
    if view.get("repeat"):
        payload["repeat"] = {k: v for k, v in view["repeat"].items() if v is not None}
    if view.get("data") is not None:
        payload["data"] = view["data"]
    if keep_window and view.get("window") is not None:
        payload["window"] = view["window"]
    if view.get("expireAfter") is not None:
        payload["expireAfter"] = view["expireAfter"]
    if view.get("labels"):
        payload["labels"] = view["labels"]
    return payload


def _json(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload).encode()


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")
