"""The replica's estimate of the database clock: a lower bound, so a claimed-ahead timer is never early."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime

import pytest

from worker.core.clock import MAX_DRIFT, DbClock


def reading(offset_s: float) -> datetime:
    """A database clock reading that is `offset_s` ahead of this machine's wall clock right now."""
    return datetime.fromtimestamp(time.time() + offset_s, UTC)


def test_the_estimate_follows_the_database_clock_not_ours() -> None:
    w = DbClock()
    w.observe(reading(+30.0))  # the database clock is 30 s ahead of ours
    assert 29.9 < w.now() - time.time() < 30.1


def test_a_lower_reading_replaces_the_estimate() -> None:
    # Half a second lower: a delayed reading, or the database clock stepped back. Only the
    # lower estimate is safe in both cases.
    w = DbClock()
    w.observe(reading(+30.0))
    w.observe(reading(+29.5))
    assert 29.4 < w.now() - time.time() < 29.6


def test_the_estimate_is_never_ahead_of_any_reading_plus_the_time_since() -> None:
    w = DbClock()
    started = time.monotonic()
    w.observe(reading(-5.0))  # our wall clock is 5 s ahead: the estimate must not follow it
    estimate = w.now()
    assert estimate <= time.time() - 5.0 + (time.monotonic() - started) + 1e-3


def test_a_wall_clock_step_does_not_move_the_estimate(monkeypatch: pytest.MonkeyPatch) -> None:
    w = DbClock()
    w.observe(reading(0.0))
    before = w.now()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)  # NTP steps our clock an hour
    assert abs(w.now() - before) < 0.5


MAX_DELAY_S = 0.02  # a reading of clock_timestamp() arrives up to this late
STEP_BACK_S = 2.0  # a failover to a primary whose clock is behind


@pytest.mark.parametrize("drift", [+MAX_DRIFT, -MAX_DRIFT])
def test_never_ahead_of_the_database_clock_under_drift_and_a_step_back(drift: float) -> None:
    """Ten simulated minutes: our monotonic clock runs `drift` fast against the database clock,
    which steps back by two seconds halfway. Claims read the database clock at random intervals
    (up to a minute apart, as an idle replica's may be), each reading arriving up to 20 ms late.
    Right after each reading, and between readings while the database clock holds its rate, the
    estimate is never ahead of the database clock, and behind it by no more than the reading's
    delay plus the drift allowance since."""
    rng = random.Random(5)
    now = [0.0]  # real elapsed seconds
    step_at = 300.0

    def database(at: float) -> float:
        return 1.8e9 + at - (STEP_BACK_S if at >= step_at else 0.0)

    def check(at: float, since_reading: float, delay: float) -> None:
        now[0] = at
        estimate = clock.now()
        assert estimate <= database(at), f"{(estimate - database(at)) * 1000:.3f} ms ahead at {at:.2f} s"
        allowed = delay + 2 * MAX_DRIFT * since_reading + 1e-6
        assert database(at) - estimate <= allowed, f"{(database(at) - estimate) * 1000:.3f} ms behind"

    clock = DbClock(lambda: 1000.0 + now[0] * (1 + drift))
    clock.observe(datetime.fromtimestamp(database(0.0), UTC))
    last, delay = 0.0, 0.0
    while last < 600.0:
        gap = rng.choice([rng.uniform(0.05, 3.0), rng.uniform(3.0, 60.0)])
        if last < step_at < last + gap:
            gap = step_at - last + MAX_DELAY_S  # the step comes before the next reading is taken
        for fraction in (0.25, 0.5, 0.75):
            if (last < step_at) == (last + gap * fraction < step_at):  # no step since the reading
                check(last + gap * fraction, gap * fraction, delay)
        last += gap
        delay = rng.uniform(0.0, MAX_DELAY_S)
        now[0] = last
        clock.observe(datetime.fromtimestamp(database(last - delay), UTC))
        check(last, 0.0, delay)


def test_the_estimate_runs_from_when_the_reading_arrived_not_from_when_it_was_observed() -> None:
    """A claim's reading arrives with its rows and is observed after they are read: counting from
    the arrival keeps the estimate a lower bound (nothing was read later than it arrived) and
    that much closer to the database clock."""
    t = [100.0]
    w = DbClock(lambda: t[0])
    read = datetime.fromtimestamp(1.8e9, UTC)
    w.observe(read, received=99.990)  # arrived 10 ms ago, its rows read since
    assert w.now() == pytest.approx(1.8e9 + 0.010 * (1 - MAX_DRIFT), abs=1e-6)
    w.observe(read)  # without the arrival: counted from now
    assert w.now() == pytest.approx(1.8e9, abs=1e-6)
