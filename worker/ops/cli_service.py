"""The `timer-service` commands that run something: migrate, run, console, dev, and the benchmarks."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from pathlib import Path

from worker import logs, tracing
from worker.errors import ConfigError
from worker.ops.cli_output import emit
from worker.settings import load_settings


def cmd_migrate(args: argparse.Namespace) -> int:
    from worker.adapters.postgres import migrations
    from worker.adapters.postgres.db import require_utf8

    settings = load_settings()
    url = settings.database_url.get_secret_value()
    if args.status:
        applied, pending = migrations.status(url)
        text = (
            f"applied: {', '.join(map(str, applied)) or 'none'}\n"
            f"pending: {', '.join(f'{v} ({name})' for v, name in pending) or 'none'}"
        )
        listed = {"applied": applied, "pending": [{"version": v, "name": name} for v, name in pending]}
        emit(args, listed, text)
        return 1 if pending else 0
    require_utf8(url)  # before anything is written to a database the replicas would refuse
    applied = migrations.migrate(url)
    text = f"migrations applied: {', '.join(map(str, applied))}" if applied else "schema up to date"
    emit(args, {"applied": applied}, text)
    return 0


def cmd_consumer(args: argparse.Namespace) -> int:
    """`consumer add --tenant acme`: the consumers the tenant reads, provisioned (worker/ops/consumers.py)."""
    from worker.ops.cli_nats import _jetstream
    from worker.ops.consumers import provision

    settings = load_settings()

    async def add() -> int:
        async with _jetstream(settings) as js:
            try:
                made = await provision(js, settings, args.tenant)
            except ValueError as exc:  # an earlier release's push consumer: what to do, in one line
                print(f"timer-service: {exc}", file=sys.stderr)
                return 1
        lines = [
            f"consumer {c.name} on {c.stream}: {c.filter_subject},"
            f" {f'push to {c.deliver_subject}' if c.deliver_subject else 'pull'}"
            for c in made
        ]
        emit(args, {"consumers": [dataclasses.asdict(c) for c in made]}, "\n".join(lines))
        return 0

    return asyncio.run(add())


def cmd_migrate_streams(args: argparse.Namespace) -> int:
    from worker.ops.stream_migration import migrate_streams

    settings = load_settings()
    wait = 0.0 if args.no_wait else args.timeout

    def say(line: str) -> None:
        """Its steps as they happen; with --json on stderr, and stdout holds the outcome alone."""
        print(line, file=sys.stderr if args.json else sys.stdout)

    done = asyncio.run(migrate_streams(settings, to=args.to, wait=wait, say=say))
    if args.json:
        emit(args, {"drained": done}, "")
    return 0 if done else 1


def cmd_run(args: argparse.Namespace) -> int:
    from worker.service import Replica

    settings = load_settings(**({"migrate": False} if args.no_migrate else {}))
    logs.setup(settings.log_level, settings.log_format)
    tracing.setup()
    try:
        code = asyncio.run(Replica(settings).run())
        # Drained and closed: the loop's handlers are gone, and a second SIGTERM or SIGINT (a
        # supervisor that signals the whole group, or one that repeats itself) must not turn the
        # clean exit into a death by that signal while the interpreter winds down.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        return code
    finally:
        tracing.disable()  # flushes the spans still batched


def cmd_console(args: argparse.Namespace) -> int:
    from worker.settings import load_console_settings

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


# `bench --help` of an installed package, which has no benchmarks to ask for theirs.
INSTALLED_BENCH_HELP = """usage: timer-service bench [arguments ...]

The benchmark scenarios (docs/BENCHMARKS.md). They run from a repository checkout, not an
installed package: in a checkout, `make bench` runs them and `timer-service bench --help`
lists the scenarios and their options."""


def cmd_bench(args: argparse.Namespace) -> int:
    """The benchmarks of the checkout this package runs from (tools/bench beside worker/, as in an
    editable install): they are not in the wheel, so an installed package says where they are."""
    import worker

    checkout = Path(worker.__file__).resolve().parents[1]
    if not (checkout / "tools" / "bench" / "__init__.py").is_file():
        if args.arguments[:1] in (["-h"], ["--help"]):  # every command listed shows its help
            print(INSTALLED_BENCH_HELP)
            return 0
        raise ConfigError(
            "bench: the benchmarks run from a repository checkout, not an installed package: "
            "`make bench` or `python -m tools.bench` there"
        )
    sys.path.insert(0, str(checkout))  # a console script's path has its bin/, not the checkout
    from tools.bench import main as bench

    return bench(args.arguments, prog="timer-service bench")
