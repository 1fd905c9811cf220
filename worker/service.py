"""One replica: intake, firing, read model and HTTP, supervised, with a soft then hard stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from collections.abc import Awaitable
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool
from tenacity import AsyncRetrying, retry_if_not_exception_type, wait_exponential

from worker import metrics
from worker.adapters.http_server import HttpServer
from worker.adapters.jetstream.broker import Broker
from worker.adapters.postgres import db, migrations
from worker.adapters.postgres.stats import StatsRollup
from worker.adapters.postgres.store import ORDER_GRACE, Store
from worker.config import Settings, mask_url
from worker.contract import MessageIds
from worker.core.clock import DbClock
from worker.core.domain import LOOKAHEAD_MS
from worker.core.firing import FiringLoop
from worker.core.intake import Intake
from worker.core.readmodel import ReadModel
from worker.core.retention import Retention
from worker.core.waiting import wait_any
from worker.core.wakeup import Wakeup
from worker.errors import ConfigError, DatabaseError, TransientError

log = logging.getLogger(__name__)

# A loop that has not ticked for this long makes /healthz fail.
STALL_S = 30.0
# A write in flight this long makes /readyz fail: its COMMIT waits for a synchronous standby that left.
STALLED_WRITE_S = 10.0
# After the drain timeout, the most a stopping replica takes to exit, whatever its servers do.
EXIT_MARGIN_S = 2.0
CANCEL_GRACE_S = 1.0
CLOSE_S = EXIT_MARGIN_S - CANCEL_GRACE_S


class SchemaNotReady(Exception):
    """TIMER_MIGRATE=false and the database lacks a migration this build ships."""


async def side_by_side(*steps: Awaitable[Any]) -> list[Any]:
    """Run start-up steps at once; their results in order.

    A ConfigError cancels the others at once. Any other failure lets them run to their end, so a
    ConfigError one meets still stops start-up; then the first step's failure is raised."""
    failures: dict[int, Exception] = {}

    async def step(i: int, awaitable: Awaitable[Any]) -> Any:
        try:
            return await awaitable
        except ConfigError:
            raise
        except Exception as exc:
            failures[i] = exc
            return None

    fatal: BaseException | None = None
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(step(i, s)) for i, s in enumerate(steps)]
    except BaseExceptionGroup as errors:  # ConfigErrors only
        fatal = errors.exceptions[0]
    # Raised outside the handler: as itself, no group around it.
    if fatal is not None:
        raise fatal
    if failures:
        raise failures[min(failures)]
    return [t.result() for t in tasks]


class Replica:
    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.stop = asyncio.Event()
        self.clock = DbClock()
        self.wakeup = Wakeup(self.clock, lead_s=LOOKAHEAD_MS / 1000)
        self.broker = Broker(settings)
        self.pool: AsyncConnectionPool[Any] = db.pool(
            settings.database_url.get_secret_value(),
            settings.worker_id,
            min_size=2,
            max_size=settings.db_pool_size,
            idle_in_transaction_ms=settings.lease_ms,
        )
        # A command deferred for a few leases without its timer claimed no longer holds up later ones.
        grace = max(ORDER_GRACE, 3 * timedelta(milliseconds=settings.lease_ms))
        self.store = Store(self.pool, settings.stuck_after, grace)
        self.firing = FiringLoop(settings, self.store, self.broker, self.wakeup, self.clock)
        self.intake = Intake(settings, self.store, self.broker, self.wakeup, self.clock)
        self.http = HttpServer(settings.http_host, settings.http_port, self.healthy, self.ready)
        self.http_port: int | None = None
        self.started = asyncio.Event()  # dependencies up, streams exist, loops starting
        self.exit_by: float | None = None  # loop time by which a stopping replica exits
        self.writes_stalled = False

    async def run(self, handle_signals: bool = True) -> int:
        """Run until SIGTERM/SIGINT (or stop set); 0 after a clean drain."""
        if handle_signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop.set)
        self.http_port = await self.http.start()  # up first: /readyz answers false while we connect
        try:
            if not await self.connect():
                return 0  # stopped before the dependencies came up
            log.info(
                "replica started",
                extra={
                    "action": "replica_started",
                    "worker_id": self.s.worker_id,
                    "database": mask_url(self.s.database_url.get_secret_value()),
                    "nats": mask_url(self.s.nats_url, userinfo_is_secret=True),
                },
            )
            return await self._supervise()
        finally:
            await self._close()

    async def _close(self) -> None:
        """Close NATS, Postgres and HTTP side by side, by `exit_by`: a server that does not answer
        must not hold the exit, and a close cut short loses nothing (redelivery, lease expiry)."""
        budget = max(CLOSE_S, (self.exit_by or 0.0) - asyncio.get_running_loop().time())
        closes = {
            "nats": asyncio.ensure_future(self.broker.close(budget)),
            "postgres": asyncio.ensure_future(self._close_postgres(budget)),
            "http": asyncio.ensure_future(self.http.close()),
        }
        await asyncio.wait(closes.values(), timeout=budget)
        cut = []
        for name, task in closes.items():
            if not task.done():
                task.cancel()  # not waited for: the process exits
                cut.append(name)
            elif task.cancelled() or task.exception() is not None or task.result() is False:
                cut.append(name)
        if cut:
            what = ",".join(cut)
            log.warning(
                "not closed cleanly", extra={"action": "close_cut", "what": what, "timeout_s": budget}
            )

    async def _close_postgres(self, timeout: float) -> None:
        await self.store.close()
        await self.pool.close(timeout=timeout)

    async def connect(self) -> bool:
        """Wait for Postgres and NATS side by side (with back-off), migrate, ensure streams; False
        when stopped first. A ConfigError is not retried."""
        async for attempt in AsyncRetrying(
            retry=retry_if_not_exception_type(ConfigError),
            wait=wait_exponential(multiplier=0.2, max=5),
            before_sleep=lambda rs: log.warning(
                "dependencies not ready",
                extra={"action": "connect_retry", "error": str(rs.outcome.exception() if rs.outcome else "")},
            ),
        ):
            with attempt:
                if self.stop.is_set():
                    return False
                await side_by_side(self._connect_postgres(), self._connect_nats())
        return True

    async def _connect_postgres(self) -> None:
        """The pool opens beside the schema check: no loop uses it before connect returns."""
        opening = asyncio.ensure_future(self.pool.open(wait=True, timeout=10))
        try:
            secret = await asyncio.to_thread(self._schema)
            await opening
        finally:
            if not opening.done():
                # The check failed: retried after a back-off, not after the pool's timeout.
                opening.cancel()
            elif not opening.cancelled():
                opening.exception()  # seen: the schema check's error is the one raised
        self.broker.ids = self.store.ids = MessageIds(secret)

    async def _connect_nats(self) -> None:
        if not self.broker.connected:
            # Bounded: nats-py retries a first connect forever, and a SIGTERM must get a look-in.
            await asyncio.wait_for(self.broker.connect(), timeout=10)
        await self.broker.ensure_streams()

    def _schema(self) -> bytes:
        """Migrate (or wait until someone has), then read the fleet secret; one session for both."""
        with db.connect(self.s.database_url.get_secret_value()) as conn:
            db.require_utf8(conn)  # before anything is written
            if self.s.migrate:
                migrations.migrate(conn)
            elif missing := migrations.status(conn)[1]:
                raise SchemaNotReady(
                    f"migrations not applied yet: {', '.join(f'{v:04d}_{n}' for v, n in missing)}"
                )
            return db.fleet_secret(conn)

    async def _supervise(self) -> int:
        readmodel = ReadModel(self.store, self.s.subject_prefix)
        await self.broker.subscribe(
            self.broker.subjects.of("*", "get"),
            readmodel.receive,
            queue="timer-service-get",
            then=readmodel.drain,
        )
        await self.broker.subscribe(self.broker.subjects.wake, self._on_wake)
        self.started.set()
        tasks = {
            asyncio.create_task(self.intake.run(self.stop), name="intake"),
            asyncio.create_task(self.firing.run(self.stop), name="firing"),
            asyncio.create_task(self._gauges(), name="gauges"),
            asyncio.create_task(Retention(self.store, self.s.retention).run(self.stop), name="retention"),
            asyncio.create_task(StatsRollup(self.pool, self.s.worker_id).run(self.stop), name="stats"),
            asyncio.create_task(self.broker.tend_commands(self.stop), name="command-stream"),
        }
        stopper = asyncio.create_task(self.stop.wait(), name="stop")
        done, _ = await asyncio.wait(tasks | {stopper}, return_when=asyncio.FIRST_COMPLETED)
        crashed = [t for t in done if t is not stopper and t.exception() is not None]
        for t in crashed:
            if isinstance(t.exception(), DatabaseError):  # not a bug: one line
                log.error(
                    str(t.exception()),
                    extra={"action": "database_refused", "loop": t.get_name(), "error": str(t.exception())},
                )
                continue
            log.error(
                "loop died", extra={"action": "loop_died", "loop": t.get_name()}, exc_info=t.exception()
            )
        self.stop.set()
        self.exit_by = asyncio.get_running_loop().time() + self.s.drain_timeout_ms / 1000 + EXIT_MARGIN_S
        log.info("draining", extra={"action": "drain_started"})
        # Soft stop: loops finish the batch in hand; after the drain timeout, unrecorded claims expire.
        _, late = await asyncio.wait(tasks, timeout=self.s.drain_timeout_ms / 1000)
        for t in late:
            t.cancel()
        # The exit is bounded whatever a loop does with its cancellation.
        if late and (stuck := (await asyncio.wait(late, timeout=CANCEL_GRACE_S))[1]):
            log.error(
                "loop ignored its cancellation",
                extra={"action": "loop_stuck", "loop": ",".join(sorted(t.get_name() for t in stuck))},
            )
        log.info("stopped", extra={"action": "replica_stopped", "hard": bool(late)})
        return 1 if crashed else 0

    def _writes_stalled(self) -> str | None:
        """Why readiness fails for a write in flight past STALLED_WRITE_S, else None."""
        oldest = self.store.writes.oldest_s()
        metrics.DB_OLDEST_WRITE.set(oldest)
        stalled = oldest > STALLED_WRITE_S
        if stalled != self.writes_stalled:
            self.writes_stalled = stalled
            if stalled:
                log.warning(
                    "postgres writes stalled: a COMMIT waits, for a synchronous standby that left?",
                    extra={"action": "db_writes_stalled", "oldest_write_s": round(oldest, 1)},
                )
            else:
                log.info("postgres writes flowing again", extra={"action": "db_writes_flowing"})
        if not stalled:
            return None
        return f"postgres writes stalled: one has waited {oldest:.0f}s (a synchronous standby gone?)"

    async def _on_wake(self, msg: Any) -> None:
        """Another replica's hint, untrusted: a bare due time, no reply or headers."""
        try:
            due = float(msg.data)
        except ValueError:
            due = math.nan
        if msg.reply or msg.headers:
            why = "foreign"
        elif not math.isfinite(due):  # nan would wake at once, inf never
            why = "unreadable"
        elif self.wakeup.peer_hint(due):
            return
        else:
            why = "limited"
        metrics.WAKE_HINTS_DROPPED.labels(why).inc()

    async def _gauges(self) -> None:
        """Cheap fleet gauges and pool stats, every few seconds."""
        rounds = 0
        while not self.stop.is_set():
            # Fleet gauges less often: an idle replica stays under one statement a second.
            if rounds % 3 == 0:
                with contextlib.suppress(TransientError):  # readiness reports it
                    overdue, oldest, scheduled = await self.store.fleet_gauges(metrics.OVERDUE_CAP)
                    metrics.OVERDUE.set(overdue)
                    metrics.OLDEST_OVERDUE_SECONDS.set(oldest or 0.0)
                    metrics.SCHEDULED.set(scheduled)
                    paused, paused_tenants = await self.store.paused_gauges(metrics.OVERDUE_CAP)
                    metrics.PAUSED.set(paused)
                    metrics.PAUSED_TENANTS.set(paused_tenants)
                ok, _ = await self.ready()
                metrics.READY.set(1 if ok else 0)
            rounds += 1
            metrics.DB_OLDEST_WRITE.set(self.store.writes.oldest_s())
            stats = self.pool.get_stats()
            metrics.DB_POOL.labels("size").set(stats.get("pool_size", 0))
            metrics.DB_POOL.labels("available").set(stats.get("pool_available", 0))
            metrics.DB_POOL_WAITING.set(stats.get("requests_waiting", 0))
            await wait_any(5, self.stop)

    async def healthy(self) -> tuple[bool, str]:
        now, stall = time.time(), max(STALL_S, 3 * self.s.poll_interval_ms / 1000)
        for loop in ("intake", "firing"):
            last = metrics.last_tick(loop)
            if last and now - last > stall:
                return False, f"{loop} loop has not ticked for {now - last:.0f}s"
        return True, "ok"

    async def ready(self) -> tuple[bool, str]:
        if self.stop.is_set():
            return False, "stopping"
        if not self.broker.connected:
            return False, "nats not connected"
        if self.broker.problem:
            self.broker.check_streams_soon()
            return False, self.broker.problem
        try:  # bounded, on a connection outside the pool
            await self.store.ping()
        except (TransientError, DatabaseError, TimeoutError) as exc:
            return False, f"postgres not reachable: {type(exc.__cause__ or exc).__name__}"
        if self.store.write_failure:  # reachable, refusing writes
            return False, f"postgres writes failing: {self.store.write_failure}"
        if stalled := self._writes_stalled():
            return False, stalled
        if not self.started.is_set():
            return False, "starting"
        return True, "ok"
