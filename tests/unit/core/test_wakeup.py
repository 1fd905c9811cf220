"""When the firing loop looks at the database next (worker/core/wakeup.py): a sleep ends at its
length, at a hint's due time on the database clock (less the claims' lead), or at a stop.

The database clock here is a FakeClock at epoch second 1000, nowhere near this machine's wall
clock: a Wakeup that read the wall clock would take every hint for long past and wake at once.
Lengths are measured on the monotonic clock, as Wakeup measures them.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.twins import FakeClock, FakeTime
from worker.core.wakeup import PEER_HINT_SPACING_S, Wakeup

DB_NOW = 1000.0  # the database clock, in epoch seconds
SHORT_S = 0.05  # a sleep that is meant to run its length
LONG_S = 30.0  # a sleep that only a hint or a stop may end; the test fails long before it would


@pytest.fixture
def wakeup() -> Wakeup:
    return Wakeup(FakeClock(FakeTime(DB_NOW)), lead_s=0.1)


async def timed(wakeup: Wakeup, seconds: float, stop: asyncio.Event | None = None) -> float:
    started = time.monotonic()
    await wakeup.sleep(seconds, stop or asyncio.Event())
    return time.monotonic() - started


async def ended_early(sleeping: asyncio.Task[float]) -> float:
    """The length of a LONG_S sleep that something must end: fails if it runs on."""
    return await asyncio.wait_for(sleeping, timeout=5)


async def test_without_a_hint_a_sleep_runs_its_length(wakeup: Wakeup) -> None:
    assert await timed(wakeup, SHORT_S) >= SHORT_S


async def test_a_hint_for_now_ends_a_sleep_at_once(wakeup: Wakeup) -> None:
    sleeping = asyncio.create_task(timed(wakeup, LONG_S))
    await asyncio.sleep(0)  # the sleep has begun: the hint must reach it, not the next one
    wakeup.hint(DB_NOW)
    assert await ended_early(sleeping) < 1


async def test_a_hint_wakes_the_lead_before_its_due_time(wakeup: Wakeup) -> None:
    """The claims reach lead_s ahead, so a hint due that far off is claimable now."""
    sleeping = asyncio.create_task(timed(wakeup, LONG_S))
    await asyncio.sleep(0)
    wakeup.hint(DB_NOW + wakeup.lead_s)
    assert await ended_early(sleeping) < 1


async def test_a_hint_reads_the_database_clock_not_the_wall_clock(wakeup: Wakeup) -> None:
    """Due 0.3 s from now on the database clock: the sleep lasts about that (less the lead), not
    zero, as it would if 'now' were this machine's wall clock (which says epoch 1000 is long past)."""
    sleeping = asyncio.create_task(timed(wakeup, LONG_S))
    await asyncio.sleep(0)
    wakeup.hint(DB_NOW + 0.3)
    assert 0.3 - wakeup.lead_s <= await ended_early(sleeping) < 1


async def test_a_later_hint_does_not_lengthen_or_shorten_a_sleep(wakeup: Wakeup) -> None:
    sleeping = asyncio.create_task(timed(wakeup, SHORT_S))
    await asyncio.sleep(0)
    wakeup.hint(DB_NOW + 60)
    assert SHORT_S <= await ended_early(sleeping) < 1


async def test_a_hint_given_between_sleeps_shortens_the_next_one(wakeup: Wakeup) -> None:
    """Intake may store a sooner timer while the loop is claiming, not sleeping: not lost."""
    wakeup.hint(DB_NOW)
    assert await asyncio.wait_for(timed(wakeup, LONG_S), timeout=5) < 1


async def test_a_hint_is_spent_by_the_sleep_it_ended(wakeup: Wakeup) -> None:
    wakeup.hint(DB_NOW)
    await asyncio.wait_for(timed(wakeup, LONG_S), timeout=5)
    assert await timed(wakeup, SHORT_S) >= SHORT_S  # not every later sleep cut short


async def test_stop_ends_a_sleep_at_once(wakeup: Wakeup) -> None:
    stop = asyncio.Event()
    sleeping = asyncio.create_task(timed(wakeup, LONG_S, stop))
    await asyncio.sleep(0)
    stop.set()
    assert await ended_early(sleeping) < 1


# --- hints from other replicas: untrusted, rate-limited ------------------------------------------


async def test_a_flood_of_peer_hints_wakes_the_loop_once_per_interval(wakeup: Wakeup) -> None:
    """What comes on the wake subject may be a flood (a JetStream consumer pointed at it): each
    early wake-up is a claim. However many hints, at most one per PEER_HINT_SPACING_S ends a
    sleep, and the rest are reported held back, for the metric."""
    stop = asyncio.Event()
    wakes = 0

    async def loop() -> None:
        nonlocal wakes
        while not stop.is_set():
            await wakeup.sleep(LONG_S, stop)
            wakes += 1

    sleeping = asyncio.create_task(loop())
    started = time.monotonic()
    held_back = sent = 0
    while time.monotonic() - started < 10 * PEER_HINT_SPACING_S:
        held_back += not wakeup.peer_hint(DB_NOW)
        sent += 1
        await asyncio.sleep(0)  # the loop runs between hints, as between messages
    elapsed = time.monotonic() - started
    stop.set()
    await asyncio.wait_for(sleeping, timeout=5)
    assert sent > 100, "a flood, not a trickle"
    assert 1 <= wakes <= elapsed / PEER_HINT_SPACING_S + 2  # (+ the stop's own wake-up)
    assert held_back >= sent - wakes


async def test_a_peer_hint_held_back_still_wakes_the_loop_at_the_end_of_the_interval(wakeup: Wakeup) -> None:
    assert wakeup.peer_hint(DB_NOW)  # the first: at once
    await asyncio.wait_for(timed(wakeup, LONG_S), timeout=5)
    assert not wakeup.peer_hint(DB_NOW)  # the second, at once after: held back, not lost
    took = await asyncio.wait_for(timed(wakeup, LONG_S), timeout=5)
    assert took < PEER_HINT_SPACING_S + 0.5


async def test_the_replicas_own_hints_are_not_limited_by_its_peers(wakeup: Wakeup) -> None:
    assert wakeup.peer_hint(DB_NOW)
    await asyncio.wait_for(timed(wakeup, LONG_S), timeout=5)
    assert not wakeup.peer_hint(DB_NOW)  # a peer's: held back to the end of the interval
    wakeup.hint(DB_NOW)  # this replica's intake stored a timer due now: at once
    assert await asyncio.wait_for(timed(wakeup, LONG_S), timeout=5) < PEER_HINT_SPACING_S / 2
