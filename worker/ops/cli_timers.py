"""The timer commands of `timer-service`: schedule, cancel, status, list, describe."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

import nats.errors

from worker.config import Settings, load_settings, parse_duration
from worker.contract import Rejection, iso
from worker.errors import ConfigError
from worker.ops.cli_nats import first_line, jetstream, with_client


def _due(args: argparse.Namespace) -> datetime:
    if args.due_in:
        return datetime.now(UTC) + parse_duration(args.due_in)
    due: datetime = args.due_at
    return due


def _backlog(settings: Settings) -> tuple[Any, str | None]:
    """(the command backlog or None, why it is unknown): for `status` and `describe`, which
    answer from the database even when NATS is not there."""
    from worker.ops.fleet import command_backlog

    async def read() -> Any:
        async with jetstream(settings) as js:
            return await command_backlog(js, settings)

    try:
        found = asyncio.run(read())
    except (OSError, nats.errors.Error) as exc:
        return None, f"unknown, NATS did not answer (TIMER_NATS_URL): {first_line(exc)}"
    return found, None if found is not None else "unknown: no replica has created the command consumer yet"


def cmd_schedule(args: argparse.Namespace) -> int:
    from worker.core.commands import parse_command

    settings = load_settings()
    if args.every is None and (args.times is not None or args.timezone is not None):
        raise ConfigError("--times and --timezone repeat a timer: they need --every")
    due = _due(args)
    payload: dict[str, Any] = {"tenantId": args.tenant, "serviceCallId": args.id, "dueAt": iso(due)}
    if args.every:
        repeat = {"every": args.every, "times": args.times, "timezone": args.timezone}
        payload["repeat"] = {k: v for k, v in repeat.items() if v is not None}
    if args.correlation_id is not None:
        payload["correlationId"] = args.correlation_id
    # The service's own check, before sending: a command it would only copy to the DLQ is not sent.
    checked = parse_command(
        "schedule",
        args.tenant,
        json.dumps(payload).encode(),
        now=datetime.now(UTC),
        max_horizon=settings.max_horizon,
    )
    if isinstance(checked, Rejection):
        raise ConfigError(f"not sent, the service would reject it: {checked.reason}: {checked.detail}")
    asyncio.run(
        with_client(
            settings,
            lambda c: c.schedule(
                args.tenant, args.id, due, correlation_id=args.correlation_id, repeat=payload.get("repeat")
            ),
        )
    )
    print(f"scheduled {args.tenant}/{args.id} at {iso(due)}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from worker.ops.reads import cancel_outcome, connect, describe

    settings = load_settings()
    url = settings.database_url.get_secret_value()
    with connect(url) as conn:
        before = describe(conn, args.tenant, args.id)
    asyncio.run(with_client(settings, lambda c: c.cancel(args.tenant, args.id)))
    code, line = cancel_outcome(url, args.tenant, args.id, args.wait, before)
    print(line, file=sys.stdout if code == 0 else sys.stderr)
    return code


def cmd_status(args: argparse.Namespace) -> int:
    from worker.ops.reads import camel, one_timer, overview, render_overview

    settings = load_settings()
    if args.id:
        if not args.tenant:
            raise ConfigError("status: --id needs --tenant")
        view = asyncio.run(with_client(settings, lambda c: c.get(args.tenant, args.id)))
        if view is None:
            print(f"not found: {args.tenant}/{args.id}", file=sys.stderr)
            return 1
        print(json.dumps(view, indent=2) if args.json else one_timer(view))
        return 0
    if args.tenant:  # a tenant without --id: that tenant's summary
        from worker.ops.reads import connect, render_summary, tenant_summary

        with connect(settings.database_url.get_secret_value()) as conn:
            summary = tenant_summary(conn, args.tenant)
        print(json.dumps(camel(summary), indent=2) if args.json else render_summary(summary))
        return 0
    report = overview(settings.database_url.get_secret_value(), top=args.top)
    backlog, unknown = _backlog(settings)
    if args.json:
        report["commands"] = backlog.as_dict() if backlog is not None else {"unknown": unknown}
        print(json.dumps(camel(report), indent=2))
    else:
        print(render_overview(report, backlog.line() if backlog is not None else unknown))
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from worker.ops.reads import TimerFilter, connect, list_timers, render_page, row_json

    try:
        f = TimerFilter(
            tenant_id=args.tenant,
            state=args.state,
            due_from=args.due_from,
            due_to=args.due_to,
            overdue=args.overdue,
        )
        with connect(load_settings().database_url.get_secret_value()) as conn:
            page = list_timers(conn, f, args.after, args.limit)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.json:
        print(json.dumps({"timers": [row_json(r) for r in page.rows], "next": page.next_cursor}, indent=2))
    else:
        print(render_page(page))
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    from worker.ops.reads import connect, describe, one_timer

    settings = load_settings()
    with connect(settings.database_url.get_secret_value()) as conn:
        view = describe(conn, args.tenant, args.id)
    if view is None:
        why = _why_missing(settings, args.tenant, args.id)
        print(f"not found: {args.tenant}/{args.id}; {why}", file=sys.stderr)
        return 1
    print(json.dumps(view, indent=2) if args.json else one_timer(view))
    return 0


def _why_missing(settings: Settings, tenant: str, sid: str) -> str:
    """A timer the database does not have: queued behind other commands, or rejected?"""
    dlq_list = f"timer-service dlq list --tenant {tenant} --id {sid}"
    backlog, unknown = _backlog(settings)
    if backlog is None:
        return f"the command backlog is {unknown}; if it was sent, it may have been rejected: {dlq_list}"
    if backlog.waiting and not backlog.pullers:
        return (
            f"{backlog.waiting} command(s) wait in the command stream and no replica is taking them: "
            "if it was sent, it is queued until a replica runs (timer-service status)"
        )
    if backlog.waiting:
        return (
            f"{backlog.waiting} command(s) are not applied yet ({backlog.pullers} replica(s) taking "
            f"commands): if it was sent just now, ask again shortly; if it stays missing: {dlq_list}"
        )
    return f"no command waits to be applied: if it was sent, it was rejected: {dlq_list}"
