"""The `timer-service` commands on timers: schedule and cancel (one, or many --from-file, in
cli_import.py), pause, resume, status, list, describe."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

from worker.config import Settings, parse_duration
from worker.contract import Rejection, ScheduleTimer, iso
from worker.errors import ConfigError
from worker.ops.cli_import import applied_or_dlq, send_file
from worker.ops.cli_nats import _backlog, _with_client
from worker.ops.cli_output import emit
from worker.settings import load_settings


def _due(args: argparse.Namespace) -> datetime:
    if args.due_in:
        return datetime.now(UTC) + parse_duration(args.due_in)
    due: datetime = args.due_at
    return due


def cmd_schedule(args: argparse.Namespace) -> int:
    from worker.core.commands import parse_command

    settings = load_settings()
    if args.from_file is not None:
        return send_file(settings, args, "schedule")
    if args.tenant is None or args.id is None:
        raise ConfigError("schedule needs --tenant and --id (or --from-file)")
    repeats = args.every is not None or args.cron is not None
    if not repeats and (args.times is not None or args.timezone is not None or args.until is not None):
        raise ConfigError("--times, --until and --timezone repeat a timer: they need --every or --cron")
    if args.due_at is None and args.due_in is None and args.cron is None:
        raise ConfigError("schedule: --due-at or --due-in is needed (with --cron it defaults to now)")
    # A cron schedule starts at dueAt: its first occurrence is the first match at or after it.
    due = datetime.now(UTC) if args.due_at is None and args.due_in is None else _due(args)
    payload: dict[str, Any] = {"tenantId": args.tenant, "serviceCallId": args.id, "dueAt": iso(due)}
    if repeats:
        repeat = {
            "every": args.every,
            "cron": args.cron,
            "times": args.times,
            "until": None if args.until is None else iso(args.until),
            "timezone": args.timezone,
        }
        payload["repeat"] = {k: v for k, v in repeat.items() if v is not None}
    if args.correlation_id is not None:
        payload["correlationId"] = args.correlation_id
    if args.data is not None:
        payload["data"] = args.data
    # The service's own check, before sending: a command it would only copy to the DLQ is not sent.
    checked = parse_command(
        "schedule",
        args.tenant,
        json.dumps(payload).encode(),
        now=datetime.now(UTC),
        max_horizon=settings.max_horizon,
        max_payload_bytes=settings.max_payload_bytes,
    )
    if isinstance(checked, Rejection):
        raise ConfigError(f"not sent, the service would reject it: {checked.reason}: {checked.detail}")
    assert isinstance(checked, ScheduleTimer)
    asyncio.run(
        _with_client(
            settings,
            lambda c: c.schedule(
                args.tenant,
                args.id,
                due,
                correlation_id=args.correlation_id,
                repeat=payload.get("repeat"),
                data=payload.get("data"),
            ),
        )
    )
    # What is true now: JetStream stored the command. A replica applies it shortly, or rejects it
    # (quota_exceeded, a dueAt past the horizon by then): that only shows in the DLQ. The first
    # occurrence: dueAt itself, or a cron schedule's first match at or after it.
    key = f"--tenant {args.tenant} --id {args.id}"
    sent = {
        "tenant_id": args.tenant,
        "service_call_id": args.id,
        "first_occurrence": checked.due_at,
        "dlq": f"timer-service dlq list {key}",
    }
    text = (
        f"sent {args.tenant}/{args.id} (first occurrence {iso(checked.due_at)}): in the command stream\n"
        + applied_or_dlq("schedule", f"it shortly (`timer-service describe {key}`)", key)
    )
    emit(args, sent, text)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from worker.ops.reads import cancel_outcome, connect, describe

    settings = load_settings()
    if args.from_file is not None:
        return send_file(settings, args, "cancel")
    if args.tenant is None or args.id is None:
        raise ConfigError("cancel needs --tenant and --id (or --from-file)")
    url = settings.database_url.get_secret_value()
    with connect(url) as conn:
        before = describe(conn, args.tenant, args.id)
    asyncio.run(_with_client(settings, lambda c: c.cancel(args.tenant, args.id)))
    done = cancel_outcome(url, args.tenant, args.id, args.wait, before)
    key = {"tenant_id": args.tenant, "service_call_id": args.id}
    emit(args, {**key, "outcome": done.outcome, "detail": done.line}, done.line, failed=done.code != 0)
    return done.code


def cmd_pause(args: argparse.Namespace) -> int:
    """`pause` and `resume` (docs/USING.md, Pause and resume): the command on the tenant's own subject, as a
    producer would send it; replicas apply it (a tenant's rows in chunks). Returns once JetStream
    stored it; `status --tenant` shows when it took effect."""
    settings = load_settings()
    resume = args.func is cmd_resume
    action = "resume" if resume else "pause"
    asyncio.run(
        _with_client(
            settings,
            lambda c: (c.resume if resume else c.pause)(args.tenant, args.id),
        )
    )
    what = f"{args.tenant}/{args.id}" if args.id else f"tenant {args.tenant}"
    text = f"{action} sent for {what}; `timer-service status --tenant {args.tenant}` shows it applied"
    emit(args, {"sent": action, "tenant_id": args.tenant, "service_call_id": args.id}, text)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    return cmd_pause(args)


def cmd_status(args: argparse.Namespace) -> int:
    from worker.ops.reads import camel, one_timer, overview, render_overview

    settings = load_settings()
    if args.id:
        if not args.tenant:
            raise ConfigError("status: --id needs --tenant")
        view = asyncio.run(_with_client(settings, lambda c: c.get(args.tenant, args.id)))
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
    backlog, unknown = _backlog(settings, len(report["running"]))
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
    from worker.ops.fleet_stats import running
    from worker.ops.reads import connect, describe, one_timer

    settings = load_settings()
    with connect(settings.database_url.get_secret_value()) as conn:
        view = describe(conn, args.tenant, args.id)
        alive = len(running(conn)) if view is None else 0
    if view is None:
        why = _why_missing(settings, args.tenant, args.id, alive)
        print(f"not found: {args.tenant}/{args.id}; {why}", file=sys.stderr)
        return 1
    print(json.dumps(view, indent=2) if args.json else one_timer(view))
    return 0


def _why_missing(settings: Settings, tenant: str, sid: str, running: int) -> str:
    """A timer the database does not have: queued behind other commands, or rejected?"""
    dlq_list = f"timer-service dlq list --tenant {tenant} --id {sid}"
    backlog, unknown = _backlog(settings, running)
    if backlog is None:
        return f"the command backlog is {unknown}; if it was sent, it may have been rejected: {dlq_list}"
    if backlog.waiting and not backlog.taking:
        return (
            f"{backlog.waiting} command(s) wait in the command stream and no replica is taking them: "
            "if it was sent, it is queued until a replica runs (timer-service status)"
        )
    if backlog.waiting:
        return (
            f"{backlog.waiting} command(s) are not applied yet ({backlog.taking} replica(s) taking "
            f"commands): if it was sent just now, ask again shortly; if it stays missing: {dlq_list}"
        )
    return f"no command waits to be applied: if it was sent, it was rejected: {dlq_list}"
