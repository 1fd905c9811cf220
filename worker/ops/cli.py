"""The `timer-service` command. Thin: parse arguments, build settings, call the module that does it.

Here the parser, its argument types and main; the commands by group in cli_timers.py, cli_dlq.py
and cli_service.py, and in cli_nats.py how they reach NATS."""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import sys
from datetime import UTC, datetime
from typing import Any, NoReturn

import nats.errors
import psycopg

from worker import __version__, logs
from worker.client.errors import TimerClientError
from worker.config import parse_duration
from worker.contract import REASONS, TENANT_RULE, is_valid_tenant
from worker.errors import ConfigError
from worker.ops.cli_dlq import cmd_dlq
from worker.ops.cli_nats import _first_line
from worker.ops.cli_service import (
    cmd_bench,
    cmd_console,
    cmd_consumer,
    cmd_dev,
    cmd_migrate,
    cmd_migrate_streams,
    cmd_run,
)
from worker.ops.cli_timers import (
    cmd_cancel,
    cmd_describe,
    cmd_list,
    cmd_pause,
    cmd_resume,
    cmd_schedule,
    cmd_status,
)

# Options whose value may be a time before now: `--before -7d`. argparse takes `-7d` for an
# option (only plain negative numbers are let through), so these are joined to their value
# (`--before=-7d`) before argparse sees them; see _join_relative_times.
RELATIVE_TIME_OPTIONS = ("--since", "--before", "--due-from", "--due-to")
# reads.STATES, without importing the database driver to parse a command line.
STATES = ("Scheduled", "Paused", "Reached", "Cancelled")
# The settings a command line may give instead of the environment (option's dest: variable).
SERVER_OPTIONS = {"database_url": "TIMER_DATABASE_URL", "nats_url": "TIMER_NATS_URL"}


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2) and no abbreviated options (an abbreviation
    would slip past _join_relative_times). Every command takes --database-url and --nats-url,
    before its name or after it (`bench`, which hands its arguments on, only before)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        if self.add_help:
            # Not set unless given (SUPPRESS): one given before the command's name is not undone
            # by the command's parser, which add_subparsers makes of this class too.
            for dest, variable in SERVER_OPTIONS.items():
                self.add_argument(
                    _option(dest), metavar="URL", default=argparse.SUPPRESS, help=f"instead of {variable}"
                )

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _option(dest: str) -> str:
    return f"--{dest.replace('_', '-')}"


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


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="timer-service",
        description="Durable multi-tenant timers on Postgres and NATS JetStream. Settings: TIMER_* env"
        " vars; --database-url and --nats-url override TIMER_DATABASE_URL and TIMER_NATS_URL.",
    )
    p.add_argument("--version", action="version", version=f"timer-service {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m = sub.add_parser("migrate", help="apply database migrations (idempotent, safe in parallel)")
    m.add_argument(
        "--status", action="store_true", help="list applied and pending migrations; exit 1 if any is pending"
    )
    m.add_argument("--json", action="store_true")
    m.set_defaults(func=cmd_migrate)
    ms = sub.add_parser(
        "migrate-streams",
        help="move a work-queue command stream to limits retention (safe while replicas and producers run)",
    )
    ms.add_argument("--to", help="the new command stream's name (default: <TIMER_COMMAND_STREAM>_V2)")
    ms.add_argument("--no-wait", action="store_true", help="do not wait for the old stream to drain")
    ms.add_argument("--json", action="store_true", help="the steps on stderr; on stdout whether it drained")
    ms.add_argument(
        "--timeout", type=float, default=None, help="wait at most this many seconds for it to drain (exit 1)"
    )
    ms.set_defaults(func=cmd_migrate_streams)
    cn = sub.add_parser("consumer", help="a tenant's consumers of its events and DLQ (docs/SECURITY.md)")
    cns = cn.add_subparsers(dest="consumer_command", required=True, metavar="ACTION")
    a = cns.add_parser("add", help="create them (or leave them as they are): durable, named after the tenant")
    a.add_argument("--tenant", type=_tenant, required=True)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_consumer)
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
        help="JSON Lines, one ScheduleTimer per line, flat or envelope (- for stdin): each checked as"
        " the service would, with its TIMER_* limits, and sent once as checked, in batches",
    )
    s.add_argument("--correlation-id")
    how = s.add_mutually_exclusive_group()
    how.add_argument("--every", help="repeat: ISO 8601 duration, e.g. PT1H, P1D")
    how.add_argument("--cron", help="repeat: five-field cron expression, e.g. '0 9 * * MON-FRI'")
    s.add_argument("--times", type=_count, help="repeat: number of occurrences (default forever)")
    s.add_argument("--until", type=_when, help="repeat: no occurrence after this (RFC 3339 or +duration)")
    s.add_argument("--timezone", help="repeat: IANA zone for wall-clock occurrences")
    s.add_argument("--data", type=_json_value, help="JSON delivered with every DueTimeReached: '{\"a\":1}'")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_schedule)

    c = sub.add_parser("cancel", help="cancel a timer not yet claimed, or many from a file")
    c.add_argument("--tenant", type=_tenant, help="required unless --from-file names each line's")
    one = c.add_mutually_exclusive_group()
    one.add_argument("--id", help="the serviceCallId; required unless --from-file")
    one.add_argument(
        "--from-file",
        metavar="FILE",
        help="one serviceCallId of --tenant per line, or JSON Lines of CancelTimers, flat or envelope"
        " (- for stdin): each checked as the service would and sent once as checked, in batches",
    )
    c.add_argument("--wait", type=float, default=5.0, help="seconds to wait for the outcome (default 5)")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_cancel)

    for name, func, text in (
        ("pause", cmd_pause, "pause a tenant's timers, or one (--id): they do not fire until resumed"),
        ("resume", cmd_resume, "resume a paused tenant, or one timer paused by itself (--id)"),
    ):
        pr = sub.add_parser(name, help=text)
        pr.add_argument("--tenant", required=True, type=_tenant)
        pr.add_argument("--id", help="one timer only (default: every timer of the tenant)")
        pr.add_argument("--json", action="store_true")
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
    ls.add_argument(
        "--state",
        type=_state,
        help="Scheduled, Paused, Reached or Cancelled (any case); every tenant: Scheduled or Paused",
    )
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
        else:
            a.add_argument("--yes", action="store_true", help="delete; without it, only count")
        a.add_argument("--json", action="store_true")
        a.set_defaults(func=cmd_dlq)
    a = qs.add_parser("show", help="one entry: headers and body")
    a.add_argument("seq", type=_count)
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=cmd_dlq)
    a = qs.add_parser("replay", help="re-submit an entry to its subject, then remove it from the DLQ")
    a.add_argument("seq", type=_count)
    a.add_argument("--body", help="a file with the fixed command (- for stdin) instead of the stored one")
    a.add_argument("--json", action="store_true")
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
    # Every command reads its settings from the environment, and so do the processes `dev` and
    # `bench` start: an option given is that variable, for this run.
    given = {variable: _option(dest) for dest, variable in SERVER_OPTIONS.items() if dest in args}
    for dest, variable in SERVER_OPTIONS.items():
        if dest in args:
            os.environ[variable] = getattr(args, dest)

    def fail(text: str) -> None:
        """The one line of a failure, naming the option where one stood for the variable."""
        for variable, option in given.items():
            text = text.replace(variable, option)
        print(f"timer-service: {logs.redact(text)}", file=sys.stderr)

    try:
        code: int = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except ConfigError as exc:
        fail(str(exc))
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError as exc:
        if not _stdout_closed():  # a server's socket (NATS refusing TLS without a certificate)
            fail(_first_line(exc))
            return 1
        # `timer-service dlq list | head`: the reader has what it wanted. Python's own advice
        # (docs, signal): point stdout at devnull so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a program killed by the closed pipe would
    except psycopg.Error as exc:
        # No SQLSTATE: the server was never reached (or went away), so say which setting names it.
        where = "" if exc.sqlstate else "Postgres (TIMER_DATABASE_URL): "
        fail(f"{where}{_first_line(exc)}")
        return 1
    except (OSError, nats.errors.Error, TimerClientError) as exc:
        # A server not reachable, a file not found, a replica refusing a read: a user's
        # situation, not a bug. One line.
        where = "NATS (TIMER_NATS_URL): " if isinstance(exc, nats.errors.Error) else ""
        fail(f"{where}{_first_line(exc)}")
        return 1


def _stdout_closed() -> bool:
    """True when stdout is a pipe whose reader has gone: its write end polls as an error."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (OSError, ValueError):  # no stdout to poll (closed, or not a file)
        return False


if __name__ == "__main__":
    sys.exit(main())
