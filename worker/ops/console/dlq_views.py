"""The console's DLQ pages: the listing, one entry, its replay (as it is, or edited), and the bulk
actions on every entry a filter matches: replay, purge. Bulk actions show what they will touch
and ask again; the confirmation carries the last sequence shown, so entries stored in between are
left alone. Each action is logged (`console_action`) with who did it."""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from worker.contract import MAX_ID_CHARS, REASONS, TENANT_RE, TENANT_RULE
from worker.ops import dlq
from worker.ops.cli_output import quoted
from worker.ops.console.base import action_form, audit, console_of, field, headers
from worker.ops.reads import fmt_time

BULK_SHOWN = 20
# The DLQ filter's fields, as the listing's query and the bulk forms carry them.
FILTER_FIELDS = ("tenant", "reason", "id", "from", "to")
# A time typed in `from` or `to` is read up to this long (an RFC 3339 time with an offset is 29).
TIME_CHARS = 40
SEQ_DIGITS = 18


def _when(value: str, name: str) -> datetime | None:
    """A time typed in a filter field: RFC 3339, UTC when it names no offset (the field's hint)."""
    if not value:
        return None
    try:
        when = datetime.fromisoformat(value) if len(value) <= TIME_CHARS else None
    except ValueError:
        when = None
    if when is None:
        example = "e.g. 2026-12-02T09:00Z; UTC without an offset"
        raise ValueError(f"{name}: not a time: {quoted(value)} ({example})")
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def dlq_filter(get: Callable[[str], str]) -> dlq.DlqFilter:
    """The filter the fields name (FILTER_FIELDS, read by `get`): entries of a tenant, with a reason,
    naming a serviceCallId exactly, stored from `from` (included) to `to` (excluded). ValueError in
    one line naming the first field that is not one."""
    tenant, reason, sid = get("tenant"), get("reason"), get("id")
    if tenant and not TENANT_RE.match(tenant):
        raise ValueError(f"tenant: not a tenant id ({TENANT_RULE}): {quoted(tenant)}")
    if reason and reason not in REASONS:
        raise ValueError(f"reason: not a reason code (docs/CONTRACT.md, e.g. bad_due_at): {quoted(reason)}")
    if len(sid) > MAX_ID_CHARS:
        raise ValueError(f"id: a serviceCallId is at most {MAX_ID_CHARS} characters, not {len(sid)}")
    since, before = _when(get("from"), "from"), _when(get("to"), "to")
    if since is not None and before is not None and since >= before:
        raise ValueError("from: must be before to")
    return dlq.DlqFilter(
        tenant=tenant or None, reason=reason or None, service_call_id=sid or None, since=since, before=before
    )


def sequence(value: str) -> int:
    """A DLQ sequence given in a query (`after`); ValueError for one that is not (JetStream's are
    64-bit: a longer number would be its error, not ours)."""
    if not (value.isascii() and value.isdigit()) or len(value) > SEQ_DIGITS:
        raise ValueError(f"after: a DLQ sequence, not {quoted(value, 30)}")
    return int(value)


def filter_fields(get: Callable[[str], str]) -> dict[str, str]:
    """The filter's fields as given (the page shows them back, to be fixed), each cut to a bound."""
    return {name: get(name)[: MAX_ID_CHARS + 1] for name in FILTER_FIELDS}


async def dlq_list(request: Request) -> Response:
    c = console_of(request)
    p = request.query_params
    fields = filter_fields(lambda name: (p.get(name) or "").strip())
    query = urllib.parse.urlencode({k: v for k, v in fields.items() if v})
    shown: dict[str, Any] = {"fields": fields, "query": query}
    try:
        f, after = dlq_filter(fields.__getitem__), sequence(p.get("after") or "0")
    except ValueError as exc:
        empty = dlq.DlqPage([], None)
        return c.page(request, "dlq.html", 400, page=empty, after=0, error=str(exc), **shown)
    page = await c.q.page(f, after, 50)
    return c.page(request, "dlq.html", page=page, after=after, error=None, **shown)


async def dlq_entry(request: Request) -> Response:
    c = console_of(request)
    seq = request.path_params["seq"]
    entry = await c.q.get(seq)
    if entry is None:
        return c.page(request, "gone.html", 404, seq=seq)
    return c.page(request, "dlq_entry.html", e=entry, error=None, body=entry.body_text())


async def dlq_replay(request: Request) -> Response:
    c = console_of(request)
    seq = request.path_params["seq"]
    form = await action_form(request)
    entry = await c.q.get(seq)
    if entry is None:
        return c.page(request, "gone.html", 404, seq=seq)
    posted = form.get("body")
    body = str(posted).replace("\r\n", "\n").encode() if isinstance(posted, str) else None
    edited = body if body is not None and body != entry.body else None
    try:
        done = await c.q.replay(seq, edited)
    except dlq.ReplayRefused as exc:
        return c.page(request, "dlq_entry.html", 422, e=entry, error=str(exc), body=posted)
    if done is None:
        return c.page(request, "gone.html", 404, seq=seq)
    timer = dlq.command_key(edited or entry.body)
    audit(
        request, "dlq_replay", entry.tenant, timer[1] if timer else None, seq=seq, edited=edited is not None
    )
    return c.page(request, "replayed.html", done=done, timer=timer)


async def dlq_bulk(request: Request) -> Response:
    """Replay or purge every entry the filter matches, after a confirmation."""
    c = console_of(request)
    form = await action_form(request)
    op = field(form, "op")
    try:
        f = dlq_filter(lambda name: field(form, name))
    except ValueError as exc:
        return Response(str(exc), status_code=400, headers=headers())
    if op not in ("replay", "purge"):
        return Response("bad request", status_code=400, headers=headers())
    fields = filter_fields(lambda name: field(form, name))
    upto = int(field(form, "upto")) if field(form, "upto").isdigit() else None
    if field(form, "confirm") != "yes" or upto is None:
        matched = await c.q.purge(f, confirmed=False)
        shown = [e for e in [await c.q.get(seq) for seq in matched[:BULK_SHOWN]] if e is not None]
        return c.page(
            request,
            "dlq_bulk.html",
            op=op,
            fields=fields,
            count=len(matched),
            shown=shown,
            upto=matched[-1] if matched else 0,
        )
    if op == "purge":
        gone = await c.q.purge(f, confirmed=True, upto=upto)
        audit(request, "dlq_purge", f.tenant, f.service_call_id, **_audited(f), upto=upto, count=len(gone))
        return c.page(request, "dlq_done.html", op=op, done=len(gone), refused=[])
    targets = await c.q.purge(f, confirmed=False, upto=upto)
    done, refused = 0, []
    for seq in targets:
        try:
            replayed = await c.q.replay(seq)
        except dlq.ReplayRefused as exc:
            refused.append((seq, str(exc)))
            continue
        done += replayed is not None
    audit(
        request,
        "dlq_replay_bulk",
        f.tenant,
        f.service_call_id,
        **_audited(f),
        upto=upto,
        count=done,
        refused=len(refused),
    )
    return c.page(request, "dlq_done.html", op=op, done=done, refused=refused[:BULK_SHOWN])


def _audited(f: dlq.DlqFilter) -> dict[str, str | None]:
    """The filter of a bulk action, for its audit line (tenant and id have fields of their own)."""
    return {"reason": f.reason, "since": fmt_time(f.since), "before": fmt_time(f.before)}
