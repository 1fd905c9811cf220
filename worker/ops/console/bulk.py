"""The bulk actions on the timers a tenant's page filters (only with TIMER_CONSOLE_ACTIONS): cancel,
pause or resume every timer of the tenant carrying a label filter's pairs. Each is the CancelTimer,
PauseTimers or ResumeTimers naming `labels` that `timer-service cancel --label` sends, which
replicas apply in chunks in stream order (worker/core/bulk.py): the console sends one command,
never an UPDATE of its own, and never one across tenants.

That path acts on a tenant's Scheduled and Paused timers carrying the labels: an action is offered
only where the page's filter (labels, and a state) selects exactly what it would act on (`offers`);
elsewhere the page says why not. Each is confirmed on a page of its own, showing the filter and how
many timers it matches; the confirmation is good for one send (`Confirmations`), so a form posted
twice sends once; the send is logged (`console_action`) with who, the filter and that count.
"""

from __future__ import annotations

import dataclasses
import secrets
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from worker.contract import LABEL_KEY_RULE, MAX_LABEL_VALUE_CHARS, MAX_LABELS, TENANT_RE
from worker.ops import browse, reads
from worker.ops.console.base import action_form, audit, console_of, field, headers, label_filter, may_act, who

WHAT = {"cancel": "Cancel", "pause": "Pause", "resume": "Resume"}
COMMAND = {"cancel": "CancelTimer", "pause": "PauseTimers", "resume": "ResumeTimers"}
# What the label path acts on: a filter by one of these states is a part of it.
ACTED_ON = ("Scheduled", "Paused")
# Timers a bulk action's confirmation counts at most (the count reads them).
CONFIRM_COUNT_CAP = 100_000
# Timers the tenant's page counts at most for its offer ("Cancel all 1,000+ matching"): the page's
# own reads stay near its 50 rows; the confirmation counts further.
OFFER_COUNT_CAP = 1_000
# Confirmations not yet used that the console keeps (oldest forgotten first), and for how long: an
# operator asked this many times without answering loses the oldest question, nothing else.
KEPT_CONFIRMATIONS = 1_000
CONFIRMATION_TTL_S = 15 * 60.0
BAD_LABEL = (
    f"bad label filter: each `key=value` once, at most {MAX_LABELS}, the key {LABEL_KEY_RULE}, "
    f"the value at most {MAX_LABEL_VALUE_CHARS} printable characters"
)


def offers(state: str | None, tenant_paused: bool) -> tuple[tuple[str, ...], str | None]:
    """The bulk actions sound for a label filter with this state filter (None: any state), and why
    the others are not offered (None: all are). The label path acts on the Scheduled and Paused
    timers alike, so an action is offered only where that is exactly the timers the filter shows
    that it changes."""
    if state is None:
        return tuple(WHAT), None
    if state not in ACTED_ON:
        return (), f"{state} timers are final: no command changes them."
    if state == "Paused":
        return ("resume",), (
            "With the state Paused, only resume is offered: a cancel by label takes the Scheduled "
            "timers carrying the labels too (clear the state to cancel both), and these are paused already."
        )
    if tenant_paused:  # a pause by label gives the tenant's paused timers a pause of their own too
        return (), (
            "The tenant is paused: a pause by label would give its paused timers a pause of their own, "
            "which outlasts the tenant's resume; clear the state to act on both states."
        )
    return ("pause",), (
        "With the state Scheduled, only pause is offered: a cancel by label takes the Paused timers "
        "carrying the labels too (clear the state to cancel both), and a resume has nothing to resume here."
    )


def states_of(state: str | None) -> tuple[str, ...]:
    return (state,) if state else ACTED_ON


@dataclasses.dataclass(frozen=True, slots=True)
class Asked:
    """What a confirmation was given for: only the same user sending the same action may use it."""

    user: str
    what: str
    tenant: str
    labels: tuple[tuple[str, str], ...]
    state: str | None
    count: int  # the timers the confirmation showed, for the audit line


class Confirmations:
    """The confirmations given and not yet used, each good for one send: a confirmation form posted
    twice (a double click, a reload, a replayed request) sends once. Bounded by KEPT_CONFIRMATIONS
    and CONFIRMATION_TTL_S; in the console's process, as its sessions are."""

    def __init__(
        self,
        kept: int = KEPT_CONFIRMATIONS,
        ttl_s: float = CONFIRMATION_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kept, self.ttl_s, self.clock = kept, ttl_s, clock
        self._given: OrderedDict[str, tuple[float, Asked]] = OrderedDict()

    def give(self, asked: Asked) -> str:
        now = self.clock()
        self._forget(now)
        token = secrets.token_urlsafe(18)
        self._given[token] = (now, asked)
        while len(self._given) > self.kept:
            self._given.popitem(last=False)
        return token

    def use(self, token: str, asked: Asked) -> Asked | None:
        """The confirmation `token` gave, once, when it was given for this `asked` (its count
        aside); None when it never was, was used, or expired."""
        self._forget(self.clock())
        given = self._given.get(token)
        if given is None or given[1].user != asked.user or _key(given[1]) != _key(asked):
            return None
        del self._given[token]
        return given[1]

    def __len__(self) -> int:
        return len(self._given)

    def _forget(self, now: float) -> None:
        while self._given and now - next(iter(self._given.values()))[0] > self.ttl_s:
            self._given.popitem(last=False)


def _key(asked: Asked) -> tuple[Any, ...]:
    return (asked.what, asked.tenant, asked.labels, asked.state)


def confirmations(request: Request) -> Confirmations:
    kept: Confirmations = request.app.state.confirmations
    return kept


async def offer(
    request: Request, summary: dict[str, Any], labels: dict[str, str] | None, state: str | None
) -> dict[str, Any]:
    """What a tenant's page (its `summary`) offers for its filter: the actions, how many timers they
    would act on now (up to OFFER_COUNT_CAP), and why the others are not offered. Nothing on a look
    at its live region (the offer is outside it), without a label filter, or for a reader."""
    c = console_of(request)
    nothing = {"whats": (), "why_not": None, "count": 0, "cap": OFFER_COUNT_CAP}
    if not may_act(request) or not labels or request.query_params.get("live") == "1":
        return nothing
    whats, why_not = offers(state, summary["tenant_paused_at"] is not None)
    tenant, states = summary["tenant"], states_of(state)
    count = await c.db(browse.labelled_count, tenant, labels, OFFER_COUNT_CAP, states) if whats else 0
    return nothing | {"whats": whats, "why_not": why_not, "count": count}


async def labelled_action(request: Request) -> Response:
    """Cancel, pause or resume every timer of a tenant its label filter (and state) selects: asked
    first (the count, the filter, a confirmation good once), then sent, audited and shown on the
    tenant's page with the filter."""
    c = console_of(request)
    form = await action_form(request)
    what, tenant = request.path_params["what"], request.path_params["tenant"]
    if what not in WHAT or not TENANT_RE.match(tenant):
        return Response("no such action", status_code=404, headers=headers())
    labels = label_filter([v for v in form.getlist("label") if isinstance(v, str) and v])
    if not labels:
        return Response(BAD_LABEL, status_code=400, headers=headers())
    state = field(form, "state") or None
    if state is not None and state not in reads.STATES:
        return Response(f"bad state: one of {', '.join(reads.STATES)}", status_code=400, headers=headers())
    summary = await c.db(reads.tenant_summary, tenant)
    whats, why_not = offers(state, summary["tenant_paused_at"] is not None)
    back = _tenant_url(tenant, labels, state)
    if what not in whats:
        return c.page(
            request, "bulk_confirm.html", 409, error=why_not, back=back, **_shown(what, tenant, labels, state)
        )
    asked = Asked(who(request), what, tenant, tuple(sorted(labels.items())), state, count=0)
    if field(form, "confirm") != "yes":
        count = await c.db(browse.labelled_count, tenant, labels, CONFIRM_COUNT_CAP, states_of(state))
        token = confirmations(request).give(dataclasses.replace(asked, count=count))
        return c.page(
            request, "bulk_confirm.html", error=None, back=back, count=count, cap=CONFIRM_COUNT_CAP,
            once=token, **_shown(what, tenant, labels, state),
        )  # fmt: skip
    confirmed = confirmations(request).use(field(form, "once"), asked)
    if confirmed is None:
        return c.page(
            request, "bulk_confirm.html", 409, back=back, **_shown(what, tenant, labels, state),
            error="This confirmation was used already, or is too old: nothing was sent again. "
            "The tenant's page shows what the replicas made of the first.",
        )  # fmt: skip
    assert c.client is not None, "the console's lifespan connects to NATS"
    await getattr(c.client, what)(tenant, labels=labels)
    audit(request, f"labelled_{what}", tenant, None, labels=labels, state=state, count=confirmed.count)
    return RedirectResponse(f"{back}&done=labelled_{what}", status_code=303)


def _shown(what: str, tenant: str, labels: dict[str, str], state: str | None) -> dict[str, Any]:
    return {
        "what": what,
        "label": WHAT[what],
        "command": COMMAND[what],
        "tenant": tenant,
        "labels": labels,
        "state": state,
    }


def _tenant_url(tenant: str, labels: dict[str, str], state: str | None) -> str:
    query = [("label", f"{k}={v}") for k, v in labels.items()] + ([("state", state)] if state else [])
    return f"/tenants/{urllib.parse.quote(tenant, safe='')}?{urllib.parse.urlencode(query)}"
