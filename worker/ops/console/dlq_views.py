"""The console's DLQ pages: the listing, one entry, its replay (as it is, or edited), and the bulk
actions on every entry a filter matches: replay, purge. Bulk actions show what they will touch
and ask again; the confirmation carries the last sequence shown, so entries stored in between are
left alone. Each action is logged (`console_action`) with who did it."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from worker.contract import TENANT_RE
from worker.ops import dlq
from worker.ops.console.base import action_form, audit, console_of, field, headers

BULK_SHOWN = 20


def _filter(tenant: str | None, reason: str | None) -> dlq.DlqFilter | None:
    if tenant and not TENANT_RE.match(tenant):
        return None
    return dlq.DlqFilter(tenant=tenant or None, reason=reason or None)


async def dlq_list(request: Request) -> Response:
    c = console_of(request)
    p = request.query_params
    f = _filter(p.get("tenant"), p.get("reason"))
    if f is None:
        return Response("bad tenant", status_code=400, headers=headers())
    after = int(p["after"]) if p.get("after", "").isdigit() else 0
    page = await c.q.page(f, after, 50)
    return c.page(request, "dlq.html", page=page, f=f, after=after)


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
    f = _filter(field(form, "tenant"), field(form, "reason"))
    if op not in ("replay", "purge") or f is None:
        return Response("bad request", status_code=400, headers=headers())
    upto = int(field(form, "upto")) if field(form, "upto").isdigit() else None
    if field(form, "confirm") != "yes" or upto is None:
        matched = await c.q.purge(f, confirmed=False)
        shown = [e for e in [await c.q.get(seq) for seq in matched[:BULK_SHOWN]] if e is not None]
        return c.page(
            request,
            "dlq_bulk.html",
            op=op,
            f=f,
            count=len(matched),
            shown=shown,
            upto=matched[-1] if matched else 0,
        )
    if op == "purge":
        gone = await c.q.purge(f, confirmed=True, upto=upto)
        audit(request, "dlq_purge", f.tenant, None, reason=f.reason, upto=upto, count=len(gone))
        return c.page(request, "dlq_done.html", op=op, f=f, done=len(gone), refused=[])
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
        None,
        reason=f.reason,
        upto=upto,
        count=done,
        refused=len(refused),
    )
    return c.page(request, "dlq_done.html", op=op, f=f, done=done, refused=refused[:BULK_SHOWN])
