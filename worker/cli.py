"""The `timer-service` command. Thin: parse arguments, build settings, call the module that does it."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

import nats.errors
import psycopg

from worker import __version__, logs
from worker.config import load_settings, parse_duration
from worker.errors import ConfigError


def _due(args: argparse.Namespace) -> datetime:
    if args.due_in:
        return datetime.now(UTC) + parse_duration(args.due_in)
    try:
        due = datetime.fromisoformat(args.due_at)
    except ValueError:
        raise ConfigError(f"--due-at: not an RFC 3339 time: {args.due_at!r}") from None
    if due.tzinfo is None:
        raise ConfigError("--due-at: needs a UTC offset, e.g. 2026-11-22T09:00:00Z")
    return due


async def _with_client(settings: Any, action: Any) -> Any:
    from worker.broker import connect_options
    from worker.client import TimerClient

    async def quiet(exc: Exception) -> None:  # the failure is reported once, by main()
        pass

    opts = connect_options(settings)
    servers = opts.pop("servers")
    opts.update(allow_reconnect=False, max_reconnect_attempts=1, error_cb=quiet)
    async with await TimerClient.connect(servers, settings.subject_prefix, **opts) as client:
        return await action(client)


def cmd_migrate(args: argparse.Namespace) -> int:
    from worker import migrations

    settings = load_settings()
    url = settings.database_url.get_secret_value()
    if args.status:
        applied, pending = migrations.status(url)
        print(f"applied: {', '.join(map(str, applied)) or 'none'}")
        print(f"pending: {', '.join(f'{v} ({name})' for v, name in pending) or 'none'}")
        return 1 if pending else 0
    applied = migrations.migrate(url)
    print(f"migrations applied: {', '.join(map(str, applied))}" if applied else "schema up to date")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from worker.service import Replica

    settings = load_settings(**({"migrate": False} if args.no_migrate else {}))
    logs.setup(settings.log_level, settings.log_format)
    return asyncio.run(Replica(settings).run())


def cmd_schedule(args: argparse.Namespace) -> int:
    settings = load_settings()
    repeat = None
    if args.every:
        repeat = {"every": args.every, "times": args.times, "timezone": args.timezone}
        repeat = {k: v for k, v in repeat.items() if v is not None}
    due = _due(args)
    asyncio.run(
        _with_client(
            settings,
            lambda c: c.schedule(
                args.tenant, args.id, due, correlation_id=args.correlation_id, repeat=repeat
            ),
        )
    )
    print(f"scheduled {args.tenant}/{args.id} at {due.isoformat()}")
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    settings = load_settings()
    asyncio.run(_with_client(settings, lambda c: c.cancel(args.tenant, args.id)))
    print(f"cancel sent for {args.tenant}/{args.id}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from worker.status import one_timer, overview, render

    settings = load_settings()
    if args.id:
        if not args.tenant:
            raise ConfigError("--id needs --tenant")
        view = asyncio.run(_with_client(settings, lambda c: c.get(args.tenant, args.id)))
        if view is None:
            print(f"not found: {args.tenant}/{args.id}", file=sys.stderr)
            return 1
        print(json.dumps(view, indent=2) if args.json else one_timer(view))
        return 0
    report = overview(settings.database_url.get_secret_value(), top=args.top)
    print(json.dumps(report, indent=2, default=str) if args.json else render(report))
    return 0


def cmd_dev(args: argparse.Namespace) -> int:
    from worker.dev import run_dev

    return run_dev(duration=args.duration, replicas=args.replicas, rate=args.rate)


def cmd_bench(args: argparse.Namespace) -> int:
    from worker.bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
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

    s = sub.add_parser("schedule", help="schedule (or reschedule) a timer")
    s.add_argument("--tenant", required=True)
    s.add_argument("--id", required=True, help="the serviceCallId")
    when = s.add_mutually_exclusive_group(required=True)
    when.add_argument("--due-at", help="RFC 3339 time with offset, e.g. 2026-11-22T09:00:00Z")
    when.add_argument("--due-in", help="a duration from now, e.g. 30s, 5m, PT1H")
    s.add_argument("--correlation-id")
    s.add_argument("--every", help="repeat: ISO 8601 duration, e.g. PT1H, P1D")
    s.add_argument("--times", type=int, help="repeat: number of occurrences (default forever)")
    s.add_argument("--timezone", help="repeat: IANA zone for wall-clock occurrences")
    s.set_defaults(func=cmd_schedule)

    c = sub.add_parser("cancel", help="cancel a timer not yet claimed")
    c.add_argument("--tenant", required=True)
    c.add_argument("--id", required=True)
    c.set_defaults(func=cmd_cancel)

    st = sub.add_parser("status", help="counts by state, overdue, leases; or one timer with --tenant/--id")
    st.add_argument("--tenant")
    st.add_argument("--id")
    st.add_argument("--top", type=int, default=10, help="tenants to list (default 10)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=cmd_status)

    d = sub.add_parser("dev", help="embedded Postgres + NATS, 3 replicas, a demo load, live view")
    d.add_argument("--duration", type=float, help="stop after S seconds and print a summary line")
    d.add_argument("--replicas", type=int, default=3)
    d.add_argument("--rate", type=int, default=200, help="timers scheduled per second by the demo load")
    d.set_defaults(func=cmd_dev)

    b = sub.add_parser("bench", help="benchmark scenarios (embedded servers unless URLs are given)")
    from worker.bench import add_arguments

    add_arguments(b)
    b.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logs.quiet_known_noise()
    try:
        code: int = args.func(args)
        return code
    except ConfigError as exc:
        print(f"timer-service: {logs.redact(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except (OSError, psycopg.Error, nats.errors.Error) as exc:
        # A server not reachable, a file not found: a user's situation, not a bug. One line.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"timer-service: {logs.redact(first)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
