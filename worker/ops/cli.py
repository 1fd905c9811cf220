"""The `timer-service` command. Thin: parse arguments, build settings, call the module that does it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn

import nats.errors
import psycopg
from nats.js import JetStreamContext

from worker import __version__, logs, tracing
from worker.config import Settings, load_settings, parse_duration
from worker.contract import REASONS, TENANT_RULE, Rejection, ScheduleTimer, is_valid_tenant, iso
from worker.errors import ConfigError

# Options whose value may be a time before now: `--before -7d`. argparse takes `-7d` for an
# option (only plain negative numbers are let through), so these are joined to their value
# (`--before=-7d`) before argparse sees them; see _join_relative_times.
RELATIVE_TIME_OPTIONS = ("--since", "--before", "--due-from", "--due-to")
STATES = ("Scheduled", "Reached", "Cancelled")


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2) and no abbreviated options (an abbreviation
    would slip past _join_relative_times)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _join_relative_times(argv: list[str]) -> list[str]:
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg == "--":
            out += [arg, *it]
            break
        if arg in RELATIVE_TIME_OPTIONS:
            value = next(it, None)
            if value is not None and value.startswith("-") and not value.startswith("--"):
                out.append(f"{arg}={value}")
                continue
            out.append(arg)
            if value is not None:
                out.append(value)
            continue
        out.append(arg)
    return out


# Argument types: each raises ArgumentTypeError, which Parser.error prints as one line.


def _duration(value: str) -> str:
    try:
        parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _tenant(value: str) -> str:
    if not is_valid_tenant(value):
        raise argparse.ArgumentTypeError(f"not a tenant id: {value!r} (it must match {TENANT_RULE})")
    return value


def _count(value: str) -> int:
    if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {value!r}")
    return int(value)


def _state(value: str) -> str:
    for state in STATES:
        if value.lower() == state.lower():
            return state
    raise argparse.ArgumentTypeError(f"{value!r} is not a state: one of {', '.join(STATES)}")


def _reason(value: str) -> str:
    if value not in REASONS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a reason code: one of {', '.join(sorted(REASONS))}"
        )
    return value


def _when(value: str) -> datetime:
    """RFC 3339 with an offset, or a duration before (-1h) or after (+5m) now."""
    if value[:1] in ("+", "-"):
        sign = -1 if value[0] == "-" else 1
        try:
            return datetime.now(UTC) + sign * parse_duration(value[1:])
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time or a -/+ duration: {value!r}") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{value!r} needs a UTC offset, e.g. 2026-11-22T09:00:00Z")
    return when


def _json_value(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None


def _due(args: argparse.Namespace) -> datetime:
    if args.due_in:
        return datetime.now(UTC) + parse_duration(args.due_in)
    due: datetime = args.due_at
    return due


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: without one it logs every failed attempt with a traceback. The
    failure itself is raised, and main() reports it once."""


def _nats_options() -> dict[str, Any]:
    # A command-line tool gives up at once on a NATS that is not there (a replica waits forever).
    return {"allow_reconnect": False, "max_reconnect_attempts": 1, "error_cb": _quiet}


async def _with_client(settings: Settings, action: Callable[[Any], Any]) -> Any:
    from worker.adapters.broker import connect_options
    from worker.client import TimerClient

    opts = connect_options(settings) | _nats_options()
    servers = opts.pop("servers")
    async with await TimerClient.connect(servers, settings.subject_prefix, **opts) as client:
        return await action(client)


@contextlib.asynccontextmanager
async def _jetstream(settings: Settings) -> AsyncIterator[JetStreamContext]:
    from worker.adapters.broker import connect_options
    from worker.natsconn import nats_connect

    opts = connect_options(settings) | _nats_options()
    nc = await nats_connect(opts.pop("servers"), **opts)
    try:
        yield nc.jetstream(timeout=5)
    finally:
        await nc.close()


def _backlog(settings: Settings) -> tuple[Any, str | None]:
    """(the command backlog or None, why it is unknown): for `status` and `describe`, which
    answer from the database even when NATS is not there."""
    from worker.ops.fleet import command_backlog

    async def read() -> Any:
        async with _jetstream(settings) as js:
            return await command_backlog(js, settings)

    try:
        found = asyncio.run(read())
    except (OSError, nats.errors.Error) as exc:
        return None, f"unknown, NATS did not answer (TIMER_NATS_URL): {_first_line(exc)}"
    return found, None if found is not None else "unknown: no replica has created the command consumer yet"


def cmd_migrate(args: argparse.Namespace) -> int:
    from worker.adapters import migrations
    from worker.adapters.db import require_utf8

    settings = load_settings()
    url = settings.database_url.get_secret_value()
    if args.status:
        applied, pending = migrations.status(url)
        print(f"applied: {', '.join(map(str, applied)) or 'none'}")
        print(f"pending: {', '.join(f'{v} ({name})' for v, name in pending) or 'none'}")
        return 1 if pending else 0
    require_utf8(url)  # before anything is written to a database the replicas would refuse
    applied = migrations.migrate(url)
    print(f"migrations applied: {', '.join(map(str, applied))}" if applied else "schema up to date")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from worker.service import Replica

    settings = load_settings(**({"migrate": False} if args.no_migrate else {}))
    logs.setup(settings.log_level, settings.log_format)
    tracing.setup()
    try:
        return asyncio.run(Replica(settings).run())
    finally:
        tracing.disable()  # flushes the spans still batched


def cmd_schedule(args: argparse.Namespace) -> int:
    from worker.core.commands import parse_command

    settings = load_settings()
    if args.from_file is not None:
        return _schedule_file(settings, args.from_file)
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
    # The first occurrence: dueAt itself, or a cron schedule's first match at or after it.
    print(f"scheduled {args.tenant}/{args.id} at {iso(checked.due_at)}")
    return 0


# Lines read, checked and sent at a time by `schedule --from-file`: memory stays flat for any file.
IMPORT_CHUNK = 10_000


def _schedule_file(settings: Settings, path: str) -> int:
    """`schedule --from-file`: one ScheduleTimer body per line (the schedule subject's body, its
    tenant from `tenantId`), checked as the service would (a line it would reject is reported
    with its number and reason, and not sent), the rest sent with TimerClient.schedule_many.
    A progress line on stderr while it runs (on a terminal); a summary on stdout. Exit 1 if
    any line was rejected or not stored."""
    from worker.core.commands import parse_command

    stream = sys.stdin.buffer if path == "-" else Path(path).open("rb")  # noqa: SIM115  # closed below
    progress = Progress(Path(path).stat().st_size if path != "-" else None)
    counts = {"accepted": 0, "duplicate": 0, "error": 0, "rejected": 0}

    def reject(number: int, why: str) -> None:
        counts["rejected"] += 1
        progress.clear()
        print(f"line {number}: {why}", file=sys.stderr)

    async def send(client: Any) -> None:
        chunk: list[tuple[int, dict[str, Any]]] = []
        for number, line in enumerate(stream, start=1):
            progress.read(len(line))
            if not line.strip():
                continue
            try:
                body = json.loads(line)
            except ValueError as exc:
                reject(number, f"invalid_json: {exc}")
                continue
            tenant = body.get("tenantId") if isinstance(body, dict) else "_"
            if not isinstance(tenant, str):  # the tenant a line's subject would have
                reject(number, "missing_field: tenantId is required (a string)")
                continue
            checked = parse_command(
                "schedule",
                tenant,
                line.strip(),
                now=datetime.now(UTC),
                max_horizon=settings.max_horizon,
            )
            if isinstance(checked, Rejection):
                reject(number, f"{checked.reason}: {checked.detail}")
                continue
            chunk.append((number, body))
            if len(chunk) >= IMPORT_CHUNK:
                await flush(client, chunk)
        await flush(client, chunk)

    async def flush(client: Any, chunk: list[tuple[int, dict[str, Any]]]) -> None:
        for (number, _), sent in zip(chunk, await client.schedule_many(b for _, b in chunk), strict=True):
            counts[sent.outcome] += 1
            if sent.outcome == "error":
                progress.clear()
                print(f"line {number}: not stored, send it again: {sent.error}", file=sys.stderr)
        progress.sent(len(chunk))
        chunk.clear()

    try:
        asyncio.run(_with_client(settings, send))
    finally:
        stream.close()
        progress.clear()
    print(
        f"accepted {counts['accepted']}, duplicate {counts['duplicate']},"
        f" rejected {counts['rejected']}, not stored {counts['error']}"
    )
    return 1 if counts["rejected"] or counts["error"] else 0


class Progress:
    """One line on stderr, rewritten at most 10 times a second, only on a terminal: bytes read
    of the file (when its size is known) and commands stored. Not worth a dependency."""

    def __init__(self, total: int | None) -> None:
        self.total, self.done, self.stored = total, 0, 0
        self.live = sys.stderr.isatty()
        self.shown_at = 0.0

    def read(self, n: int) -> None:
        self.done += n

    def sent(self, n: int) -> None:
        self.stored += n
        now = time.monotonic()
        if self.live and now - self.shown_at >= 0.1:
            self.shown_at = now
            share = f" {100 * self.done / self.total:5.1f}%" if self.total else ""
            print(f"\r{share} {self.stored:,} sent", end="", file=sys.stderr, flush=True)

    def clear(self) -> None:
        if self.live and self.shown_at:
            print("\r\033[K", end="", file=sys.stderr, flush=True)
            self.shown_at = 0.0


def cmd_cancel(args: argparse.Namespace) -> int:
    from worker.ops.reads import cancel_outcome, connect, describe

    settings = load_settings()
    url = settings.database_url.get_secret_value()
    with connect(url) as conn:
        before = describe(conn, args.tenant, args.id)
    asyncio.run(_with_client(settings, lambda c: c.cancel(args.tenant, args.id)))
    code, line = cancel_outcome(url, args.tenant, args.id, args.wait, before)
    print(line, file=sys.stdout if code == 0 else sys.stderr)
    return code


def cmd_pause(args: argparse.Namespace) -> int:
    """`pause` and `resume` (README, Pause and resume): the command on the tenant's own subject, as a
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
    print(f"{action} sent for {what}; `timer-service status --tenant {args.tenant}` shows it applied")
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


def cmd_dlq(args: argparse.Namespace) -> int:
    from worker.ops import dlq

    settings = load_settings()
    f = dlq.DlqFilter(
        tenant=getattr(args, "tenant", None),
        reason=getattr(args, "reason", None),
        since=getattr(args, "since", None),
        before=getattr(args, "before", None),
        service_call_id=getattr(args, "id", None),
    )
    body = None
    if getattr(args, "body", None):
        body = sys.stdin.buffer.read() if args.body == "-" else open(args.body, "rb").read()  # noqa: SIM115

    async def act() -> int:
        async with dlq.open_dlq(settings, **_nats_options()) as q:
            if args.dlq_command == "list":
                page = await q.page(f, args.after, args.limit)
                out = {"entries": [e.as_dict(with_body=False) for e in page.entries], "next": page.next_seq}
                print(json.dumps(out, indent=2) if args.json else dlq.render_entries(page))
                return 0
            if args.dlq_command == "show":
                entry = await q.get(args.seq)
                if entry is None:
                    print(f"no DLQ entry {args.seq} (replayed, purged or aged out)", file=sys.stderr)
                    return 1
                print(json.dumps(entry.as_dict(), indent=2) if args.json else dlq.render_entry(entry))
                return 0
            if args.dlq_command == "replay":
                try:
                    done = await q.replay(args.seq, body)
                except dlq.ReplayRefused as exc:
                    raise ConfigError(f"not replayed: {exc}") from None
                if done is None:
                    print(f"no DLQ entry {args.seq}: replayed or purged; nothing sent", file=sys.stderr)
                    return 1
                again = " (the command stream had it already: replayed before)" if done.duplicate else ""
                print(
                    f"replayed DLQ entry {done.seq} to {done.subject} as command {done.command_seq}"
                    f"{again}; removed from the DLQ"
                )
                return 0
            if not any((f.tenant, f.reason, f.since, f.before, f.service_call_id)):
                raise ConfigError(
                    "dlq purge: give at least one of --tenant, --id, --reason, --since, --before"
                )
            seqs = await q.purge(f, confirmed=args.yes)
            if args.yes:
                print(f"purged {len(seqs)} DLQ entries")
            else:
                print(f"{len(seqs)} DLQ entries match; run again with --yes to delete them")
            return 0

    code: int = asyncio.run(act())
    return code


def cmd_console(args: argparse.Namespace) -> int:
    from worker.config import load_console_settings

    settings = load_console_settings()
    try:
        from worker.ops.console.app import serve
    except ImportError as exc:
        raise ConfigError(f"the console needs: pip install 'timer-service[console]' ({exc})") from None
    logs.setup(settings.log_level, settings.log_format)
    serve(settings)
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from worker.devkit.dev import run_dev

    return run_dev(duration=args.duration, replicas=args.replicas, rate=args.rate)


def cmd_bench(args: argparse.Namespace) -> int:
    """The benchmarks of the checkout this package runs from (tools/bench beside worker/, as in an
    editable install): they are not in the wheel, so an installed package says where they are."""
    import worker

    checkout = Path(worker.__file__).resolve().parents[1]
    if not (checkout / "tools" / "bench" / "__init__.py").is_file():
        raise ConfigError(
            "bench: the benchmarks run from a repository checkout, not an installed package: "
            "`make bench` or `python -m tools.bench` there"
        )
    sys.path.insert(0, str(checkout))  # a console script's path has its bin/, not the checkout
    from tools.bench import main as bench

    return bench(args.arguments, prog="timer-service bench")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="timer-service",
        description="Durable multi-tenant timers on Postgres and NATS JetStream. Settings: TIMER_* env vars.",
    )
    p.add_argument("--version", action="version", version=f"timer-service {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("migrate", help="apply database migrations (idempotent, safe in parallel)")
    m.add_argument(
        "--status", action="store_true", help="list applied and pending migrations; exit 1 if any is pending"
    )
    m.set_defaults(func=cmd_migrate)
    r = sub.add_parser("run", help="run one replica until SIGTERM")
    r.add_argument(
        "--no-migrate",
        action="store_true",
        help="never change the schema; wait until `migrate` has applied it (TIMER_MIGRATE=false)",
    )
    r.set_defaults(func=cmd_run)

    s = sub.add_parser("schedule", help="schedule (or reschedule) a timer, or many from a file")
    s.add_argument("--tenant", type=_tenant, help="required unless --from-file")
    s.add_argument("--id", help="the serviceCallId; required unless --from-file")
    when = s.add_mutually_exclusive_group()
    when.add_argument("--due-at", type=_when, help="RFC 3339 time with offset, e.g. 2026-11-22T09:00:00Z")
    when.add_argument("--due-in", type=_duration, help="a duration from now, e.g. 30s, 5m, PT1H")
    when.add_argument(
        "--from-file",
        metavar="FILE",
        help="JSON Lines, one ScheduleTimer body per line (- for stdin): checked, sent in batches",
    )
    s.add_argument("--correlation-id")
    how = s.add_mutually_exclusive_group()
    how.add_argument("--every", help="repeat: ISO 8601 duration, e.g. PT1H, P1D")
    how.add_argument("--cron", help="repeat: five-field cron expression, e.g. '0 9 * * MON-FRI'")
    s.add_argument("--times", type=_count, help="repeat: number of occurrences (default forever)")
    s.add_argument("--until", type=_when, help="repeat: no occurrence after this (RFC 3339 or +duration)")
    s.add_argument("--timezone", help="repeat: IANA zone for wall-clock occurrences")
    s.add_argument("--data", type=_json_value, help="JSON delivered with every DueTimeReached: '{\"a\":1}'")
    s.set_defaults(func=cmd_schedule)

    c = sub.add_parser("cancel", help="cancel a timer not yet claimed")
    c.add_argument("--tenant", required=True, type=_tenant)
    c.add_argument("--id", required=True)
    c.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the outcome (default 5)")
    c.set_defaults(func=cmd_cancel)

    for name, func, text in (
        ("pause", cmd_pause, "pause a tenant's timers, or one (--id): they do not fire until resumed"),
        ("resume", cmd_resume, "resume a paused tenant, or one timer paused by itself (--id)"),
    ):
        pr = sub.add_parser(name, help=text)
        pr.add_argument("--tenant", required=True, type=_tenant)
        pr.add_argument("--id", help="one timer only (default: every timer of the tenant)")
        pr.set_defaults(func=func)

    st = sub.add_parser(
        "status", help="counts by state, overdue, leases; a tenant's with --tenant; one timer with --id"
    )
    st.add_argument("--tenant", type=_tenant)
    st.add_argument("--id")
    st.add_argument("--top", type=_count, default=10, help="tenants to list (default 10)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    ls = sub.add_parser("list", help="timers of a tenant (key order) or Scheduled ones by due time")
    ls.add_argument(
        "--tenant", type=_tenant, help="without it: Scheduled timers of every tenant, soonest due first"
    )
    ls.add_argument("--state", type=_state, help="Scheduled, Reached or Cancelled (any case)")
    ls.add_argument("--due-from", type=_when, help="RFC 3339, or -/+ a duration from now (-1h)")
    ls.add_argument("--due-to", type=_when, help="RFC 3339, or -/+ a duration from now (+5m); exclusive")
    ls.add_argument("--overdue", action="store_true", help="Scheduled and due by now, oldest first")
    ls.add_argument("--limit", type=_count, default=50, help="rows per page (default 50, at most 1000)")
    ls.add_argument("--after", help="the cursor a previous page printed")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_list)

    de = sub.add_parser("describe", help="one timer: every field, lease, attempts, why it has not fired")
    de.add_argument("--tenant", required=True, type=_tenant)
    de.add_argument("--id", required=True)
    de.add_argument("--json", action="store_true")
    de.set_defaults(func=cmd_describe)

    q = sub.add_parser("dlq", help="rejected commands: list, show, replay, purge")
    qs = q.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    for name, text in (("list", "entries, oldest first"), ("purge", "delete matching entries")):
        a = qs.add_parser(name, help=text)
        a.add_argument("--tenant", type=_tenant)
        a.add_argument("--id", help="the serviceCallId the rejected command names")
        a.add_argument("--reason", type=_reason, help="a reason code (Timer-Error), e.g. bad_due_at")
        a.add_argument("--since", type=_when, help="stored at or after: RFC 3339 or -duration (-1h)")
        a.add_argument("--before", type=_when, help="stored before: RFC 3339 or -duration (-7d)")
        if name == "list":
            a.add_argument(
                "--after", type=_count, default=0, help="the stream sequence a previous page printed"
            )
            a.add_argument("--limit", type=_count, default=50, help="entries per page (default 50)")
            a.add_argument("--json", action="store_true")
        else:
            a.add_argument("--yes", action="store_true", help="delete; without it, only count")
        a.set_defaults(func=cmd_dlq)
    a = qs.add_parser("show", help="one entry: headers and body")
    a.add_argument("seq", type=_count)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_dlq)
    a = qs.add_parser("replay", help="re-submit an entry to its subject, then remove it from the DLQ")
    a.add_argument("seq", type=_count)
    a.add_argument("--body", help="a file with the fixed command (- for stdin) instead of the stored one")
    a.set_defaults(func=cmd_dlq)

    co = sub.add_parser("console", help="the web console (TIMER_CONSOLE_*), on its own port")
    co.set_defaults(func=cmd_console)

    d = sub.add_parser("dev", help="embedded Postgres + NATS, 3 replicas, a demo load, live view")
    d.add_argument("--duration", type=float, help="stop after S seconds and print a summary line")
    d.add_argument("--replicas", type=int, default=3)
    d.add_argument("--rate", type=int, default=200, help="timers scheduled per second by the demo load")
    d.set_defaults(func=cmd_dev)

    # Its arguments, --help included, are tools/bench's (not in the package): handed over untouched,
    # none read as an option here (no prefix character anyone types).
    b = sub.add_parser(
        "bench",
        help="benchmark scenarios, from a repository checkout (embedded servers unless URLs are given)",
        add_help=False,
        prefix_chars="\0",
    )
    b.add_argument("arguments", nargs=argparse.REMAINDER)
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_join_relative_times(sys.argv[1:] if argv is None else argv))
    logs.quiet_known_noise()
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except ConfigError as exc:
        print(f"timer-service: {logs.redact(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `timer-service dlq list | head`: the reader has what it wanted. Python's own advice
        # (docs, signal): point stdout at devnull so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a program killed by the closed pipe would
    except psycopg.Error as exc:
        # No SQLSTATE: the server was never reached (or went away), so say which setting names it.
        where = "" if exc.sqlstate else "Postgres (TIMER_DATABASE_URL): "
        print(f"timer-service: {where}{logs.redact(_first_line(exc))}", file=sys.stderr)
        return 1
    except (OSError, nats.errors.Error) as exc:
        # A server not reachable, a file not found: a user's situation, not a bug. One line.
        where = "NATS (TIMER_NATS_URL): " if isinstance(exc, nats.errors.Error) else ""
        print(f"timer-service: {where}{logs.redact(_first_line(exc))}", file=sys.stderr)
        return 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
