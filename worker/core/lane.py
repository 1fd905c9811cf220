"""The bulk lane: commands on many timers at once, run a step at a time beside intake, tenants in turn,
so that no other command waits behind them. Held commands are signalled in progress so no other
replica gets them; a newer one of the same tenant and selector makes an older one moot. Bounded per
tenant and in all: past that, intake refuses the command (bulk_backlog)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from worker import metrics
from worker.contract import PauseTimers
from worker.core.domain import Applied, BulkAction, Outcome, Position
from worker.core.received import ReceivedCommand, answer
from worker.core.waiting import wait_any
from worker.errors import verdict

log = logging.getLogger(__name__)

# Each held command is unacknowledged: max_ack_pending must stay free for everyone else's commands.
HELD_MAX = 256
HELD_PER_TENANT = 16
# Well inside the command consumer's ack wait.
PROGRESS_EVERY_S = 3.0
FAILED_FIRST_S = 0.5
FAILED_MAX_S = 30.0

BulkWork = PauseTimers | BulkAction


def _moot_key(command: BulkWork) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """Commands of one key leave each timer as the newest does; None: not so (a cancel's timestampMs
    decides)."""
    if isinstance(command, PauseTimers):
        return command.tenant_id, ()
    if command.kind == "cancel":
        return None
    return command.tenant_id, tuple(sorted(command.selector.items()))


@dataclass(eq=False)
class Held:
    """A command the lane holds: the message to answer, and its progress between steps."""

    msg: ReceivedCommand
    command: BulkWork
    where: Position
    progress: object = None  # the step's own (bulk.py's cursor); None: from the start
    due: float = field(default_factory=time.monotonic)  # its next step, not before
    failures: int = 0
    moot: bool = False


Step = Callable[[Held], Awaitable[Applied]]
Settle = Callable[[Held, Applied], Awaitable[None]]
Retry = Callable[[Outcome], float | None]


class BulkLane:
    def __init__(self, step: Step, settle: Settle, retry: Retry) -> None:
        self._step = step
        self._settle = settle
        self._retry = retry
        self._tenants: OrderedDict[str, deque[Held]] = OrderedDict()
        self._held = 0
        self._running: Held | None = None
        self._work = asyncio.Event()
        self._closed = asyncio.Event()

    def __len__(self) -> int:
        return self._held

    async def submit(self, msg: ReceivedCommand, command: BulkWork, where: Position) -> bool:
        """Take a command without waiting for its work, held or acknowledged as moot; False: no room."""
        queue = self._tenants.get(command.tenant_id, deque())
        if (again := next((h for h in queue if h.where.seq == where.seq), None)) is not None:
            again.msg = msg  # redelivered while held: answer the newest delivery
            return True
        key = _moot_key(command)
        same = next((h for h in queue if key and not h.moot and _moot_key(h.command) == key), None)
        if same is not None:
            if same.where.seq > where.seq:  # an older one came back: the held one decides
                await _superseded(msg, command)
                return True
            same.moot = True
            if same is not self._running:  # a running one is answered once its step ends
                queue.remove(same)
                self._held -= 1
                if not queue:
                    del self._tenants[command.tenant_id]
                await _superseded(same.msg, same.command)
        if self._held >= HELD_MAX or len(queue) >= HELD_PER_TENANT:
            return False
        queue.append(Held(msg, command, where))
        self._tenants.setdefault(command.tenant_id, queue)
        self._held += 1
        self._work.set()
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Step the held commands until stop or close, then offer each again at once, for another
        replica."""
        signalling = asyncio.create_task(self._signal_progress(stop))
        try:
            while not (stop.is_set() or self._closed.is_set()):
                metrics.BULK_HELD.set(self._held)
                if not await self.step():
                    self._work.clear()
                    await wait_any(self._idle_s(), stop, self._closed, self._work)
        finally:
            signalling.cancel()
            await self._release()

    def close(self) -> None:
        self._closed.set()

    async def step(self) -> bool:
        """One step of the next due tenant's first command; False when none is due."""
        now = time.monotonic()
        tenant = next((t for t, q in self._tenants.items() if q[0].due <= now), None)
        if tenant is None:
            return False
        queue = self._tenants[tenant]
        held = self._running = queue[0]
        try:
            done = await self._step(held)
        except Exception as exc:
            if verdict(exc) == "fatal":
                raise
            held.failures += 1
            held.due = time.monotonic() + min(FAILED_FIRST_S * 2 ** min(held.failures, 16), FAILED_MAX_S)
            extra = {"action": "intake_failed", "error": f"{type(exc).__name__}: {exc}"}
            log.warning("bulk step failed", extra=extra, exc_info=verdict(exc) == "alone")
            self._tenants.move_to_end(tenant)
            return True
        finally:
            self._running = None
        outcome = done.outcomes[0]
        later = None if held.moot or outcome == "partial" else self._retry(outcome)
        if not held.moot and (outcome == "partial" or later is not None):
            if later is not None:  # a timer was claimed or busy: the next pass starts over
                held.progress, held.due = None, time.monotonic() + later
            self._tenants.move_to_end(tenant)
            return True
        queue.popleft()
        self._held -= 1
        if not queue:
            del self._tenants[tenant]
        else:
            self._tenants.move_to_end(tenant)
        await (_superseded(held.msg, held.command) if held.moot else self._settle(held, done))
        return True

    def _idle_s(self) -> float:
        soonest = min((q[0].due for q in self._tenants.values()), default=None)
        return (
            PROGRESS_EVERY_S
            if soonest is None
            else max(0.0, min(soonest - time.monotonic(), PROGRESS_EVERY_S))
        )

    async def _signal_progress(self, stop: asyncio.Event) -> None:
        while not await wait_any(PROGRESS_EVERY_S, stop, self._closed):
            for queue in list(self._tenants.values()):
                for held in list(queue):
                    await _in_progress(held.msg)

    async def _release(self) -> None:
        for queue in self._tenants.values():
            for held in queue:
                await answer(held.msg, 0.0)
        self._tenants.clear()
        self._held = 0
        metrics.BULK_HELD.set(0)


def kind_of(command: BulkWork) -> str:
    return command.kind if isinstance(command, BulkAction) else "resume" if command.resume else "pause"


async def _superseded(msg: ReceivedCommand, command: BulkWork) -> None:
    metrics.COMMANDS_APPLIED.labels(kind_of(command), "superseded").inc()
    await answer(msg)


async def _in_progress(msg: ReceivedCommand) -> None:
    try:
        await msg.in_progress()
    except Exception as exc:  # not signalled: at worst another replica is given it too, idempotent
        log.debug("progress not signalled", extra={"action": "settle_failed", "error": type(exc).__name__})
