"""The bulk lane: a replica's commands that act on many timers at once (an action by labels, a
tenant's pause or resume), run beside intake so that no other command waits behind them.

Intake hands each such command to the lane and goes on fetching. The lane runs one step (a chunk of
timers) at a time, tenants taking turns; a command it holds is signalled in progress to JetStream,
so no other replica is given it meanwhile, and answered once done. A newer pause or resume of the
same tenant and selector makes an older one moot: acknowledged at once, without work. Past its
bounds, a command is offered again later, later each time it comes back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from worker import metrics
from worker.contract import PauseTimers
from worker.core.domain import Applied, BulkAction, Position
from worker.core.received import ReceivedCommand, answer
from worker.core.waiting import wait_any

log = logging.getLogger(__name__)

# Commands the lane holds at once, and of one tenant: each held one is unacknowledged on the
# command consumer, whose max_ack_pending must stay free for everyone else's commands.
HELD_MAX = 256
HELD_PER_TENANT = 4
# A command over those bounds comes back after this, doubled at each delivery, up to the cap.
OVERFLOW_FIRST_S = 1.0
OVERFLOW_MAX_S = 30.0
# Well inside the command consumer's ack wait (adapters/jetstream/streams.py, ACK_WAIT_S).
PROGRESS_EVERY_S = 3.0

BulkWork = PauseTimers | BulkAction


def _moot_key(command: BulkWork) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """Commands of one key leave each timer as the newest of them does; None: not so (a cancel's
    timestampMs decides per timer)."""
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
    signalled: float = field(default_factory=time.monotonic)
    progress: object = None  # the step's own (core/bulk.py keeps its cursor here)
    moot: bool = False


# One step of a held command: Applied(["partial"]) while more is left.
Step = Callable[[Held], Awaitable[Applied]]
# Answers a command once done, or once a step failed (the exception).
Settle = Callable[[Held, Applied | Exception], Awaitable[None]]


class BulkLane:
    def __init__(self, step: Step, settle: Settle) -> None:
        self._step = step
        self._settle = settle
        self._tenants: OrderedDict[str, deque[Held]] = OrderedDict()
        self._held = 0
        self._running: Held | None = None
        self._work = asyncio.Event()
        self._closed = asyncio.Event()

    def __len__(self) -> int:
        return self._held

    async def submit(self, msg: ReceivedCommand, command: BulkWork, where: Position) -> None:
        """Take a command without waiting for its work: held, acknowledged as moot, or, past the
        lane's bounds, offered again later."""
        queue = self._tenants.get(command.tenant_id, deque())
        if (again := next((h for h in queue if h.where.seq == where.seq), None)) is not None:
            again.msg = msg  # redelivered while held: answer the newest delivery
            return
        key = _moot_key(command)
        same = next((h for h in queue if key and not h.moot and _moot_key(h.command) == key), None)
        if same is not None:
            if same.where.seq > where.seq:  # an older one came back: the held one decides
                await _superseded(msg, command)
                return
            same.moot = True
            if same is not self._running:  # a running one is answered once its step ends
                queue.remove(same)
                self._held -= 1
                if not queue:
                    del self._tenants[command.tenant_id]
                await _superseded(same.msg, same.command)
        if self._held >= HELD_MAX or len(queue) >= HELD_PER_TENANT:
            metrics.COMMANDS_APPLIED.labels(kind_of(command), "postponed").inc()
            await answer(msg, later(msg))
            return
        queue.append(Held(msg, command, where))
        self._tenants.setdefault(command.tenant_id, queue)
        self._held += 1
        self._work.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Step the held commands, a tenant at a time in turn, until stop or close; then offer
        every held command again at once, for another replica."""
        try:
            while not (stop.is_set() or self._closed.is_set()):
                if not await self.step():
                    self._work.clear()
                    await wait_any(PROGRESS_EVERY_S, stop, self._closed, self._work)
                await self._signal_progress()
                metrics.BULK_HELD.set(self._held)
        finally:
            await self._release()

    def close(self) -> None:
        self._closed.set()

    async def step(self) -> bool:
        """One step of the next tenant's first command; False when nothing is held."""
        if not self._tenants:
            return False
        tenant, queue = next(iter(self._tenants.items()))
        held = self._running = queue[0]
        try:
            done: Applied | Exception = await self._step(held)
        except Exception as exc:  # errors.verdict decides in settle: transient, or not ours
            done = exc
        finally:
            self._running = None
        if isinstance(done, Applied) and done.outcomes[0] == "partial" and not held.moot:
            self._tenants.move_to_end(tenant)  # the next tenant's turn
            return True
        queue.popleft()
        self._held -= 1
        if not queue:
            del self._tenants[tenant]
        else:
            self._tenants.move_to_end(tenant)
        if held.moot:
            await _superseded(held.msg, held.command)
        else:
            await self._settle(held, done)
        return True

    async def _signal_progress(self) -> None:
        now = time.monotonic()
        for queue in list(self._tenants.values()):
            for held in list(queue):
                if now - held.signalled >= PROGRESS_EVERY_S:
                    held.signalled = now
                    await _in_progress(held.msg)

    async def _release(self) -> None:
        for queue in self._tenants.values():
            for held in queue:
                await answer(held.msg, 0.0)
        self._tenants.clear()
        self._held = 0


def kind_of(command: BulkWork) -> str:
    """The command's kind, as metrics and logs name it."""
    return command.kind if isinstance(command, BulkAction) else "resume" if command.resume else "pause"


async def _superseded(msg: ReceivedCommand, command: BulkWork) -> None:
    metrics.COMMANDS_APPLIED.labels(kind_of(command), "superseded").inc()
    await answer(msg)


async def _in_progress(msg: ReceivedCommand) -> None:
    try:
        await msg.in_progress()
    except Exception as exc:  # not signalled: at worst another replica is given it too, idempotent
        log.debug("progress not signalled", extra={"action": "settle_failed", "error": type(exc).__name__})


def later(msg: ReceivedCommand) -> float:
    """When a command the lane could not take, or whose step failed, comes back: later at each delivery."""
    delivered = int(msg.metadata.num_delivered or 1)
    return float(min(OVERFLOW_FIRST_S * 2 ** min(delivered - 1, 16), OVERFLOW_MAX_S))
