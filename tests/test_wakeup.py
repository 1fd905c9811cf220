"""The replica's estimate of the database clock: a lower bound, so a claimed-ahead timer is never early."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from worker.wakeup import Wakeup


def reading(offset_s: float) -> datetime:
    """A database clock reading that is `offset_s` ahead of this machine's wall clock right now."""
    return datetime.fromtimestamp(time.time() + offset_s, UTC)


def test_the_estimate_keeps_the_freshest_reading_and_ignores_a_delayed_one() -> None:
    w = Wakeup()
    w.observe_db_now(reading(+30.0))  # the database clock is 30 s ahead of ours
    w.observe_db_now(reading(+29.5))  # the same clock, read half a second before it arrived
    assert 29.9 < w.db_now() - time.time() < 30.1


def test_the_estimate_is_never_ahead_of_any_reading_plus_the_time_since() -> None:
    w = Wakeup()
    started = time.monotonic()
    w.observe_db_now(reading(-5.0))  # our wall clock is 5 s ahead: the estimate must not follow it
    estimate = w.db_now()
    assert estimate <= time.time() - 5.0 + (time.monotonic() - started) + 1e-3


def test_a_wall_clock_step_does_not_move_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    w = Wakeup()
    w.observe_db_now(reading(0.0))
    before = w.db_now()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # NTP steps our clock an hour
    assert abs(w.db_now() - before) < 0.5
