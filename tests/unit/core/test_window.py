"""The firing window (worker/core/window.py): its length as a tenant may write it, and the instant
in [dueAt, dueAt + window] each occurrence fires at, never early, the same on every replica."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import property_settings
from worker.contract import EARLIEST_DUE_AT, LATEST_DUE_AT, MessageIds
from worker.core.window import MAX_WINDOW_MS, planned_at, window_ms

SECRET = bytes(range(32))
IDS = MessageIds(SECRET)
DUE = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("PT10M", 600_000),
        ("PT0S", 0),
        ("PT0.5S", 500),
        ("PT1,25S", 1250),
        ("PT1H30M", 5_400_000),
        ("P1D", MAX_WINDOW_MS),
        ("PT24H", MAX_WINDOW_MS),
        ("PT86400S", MAX_WINDOW_MS),
        ("PT23H59M59.999S", MAX_WINDOW_MS - 1),
    ],
)
def test_a_window_is_days_to_milliseconds(text: str, ms: int) -> None:
    assert window_ms(text) == ms


@pytest.mark.parametrize(
    "text",
    ["", "P", "PT", "P1DT", "PT24H0.001S", "P2D", "P1W", "P1M", "P1Y", "-PT1M", "PT0.0001S", "pt10m",
     "PT10M\n", " PT10M", "PT1H1H", "PT9999999999S", "P1D" + "0" * 10_000],
)  # fmt: skip
def test_anything_else_is_refused_with_a_reason(text: str) -> None:
    with pytest.raises(ValueError, match="window"):
        window_ms(text)


@property_settings(2000)
@given(st.text(max_size=200))
def test_any_text_is_a_bounded_window_or_refused(text: str) -> None:
    # The tenant writes the text: it is parsed by one bounded regex, and whatever it says, the
    # window is never longer than a day.
    try:
        ms = window_ms(text)
    except ValueError:
        return
    assert 0 <= ms <= MAX_WINDOW_MS


_dues = st.datetimes(
    min_value=EARLIEST_DUE_AT.replace(tzinfo=None),
    max_value=LATEST_DUE_AT.replace(tzinfo=None),
    timezones=st.just(UTC),
)


@property_settings(2000)
@given(
    tenant=st.text(min_size=1, max_size=64),
    service_call_id=st.text(min_size=1, max_size=200),
    due=_dues,
    seconds=st.integers(0, MAX_WINDOW_MS // 1000),
)
def test_the_planned_instant_is_in_the_window_and_the_same_on_every_replica(
    tenant: str, service_call_id: str, due: datetime, seconds: int
) -> None:
    window = f"PT{seconds}S"
    planned = planned_at(IDS, tenant, service_call_id, due, window)
    assert due <= planned <= due + timedelta(seconds=seconds)
    # Another replica (its own MessageIds of the same fleet secret), or a re-claim after a crash.
    assert planned_at(MessageIds(SECRET), tenant, service_call_id, due, window) == planned
    if planned < datetime.max.replace(tzinfo=UTC):  # else clamped at the calendar's end
        assert (planned - due) % timedelta(milliseconds=1) == timedelta(0)


def test_an_occurrence_at_the_end_of_the_range_is_never_early() -> None:
    # LATEST_DUE_AT plus a day is past any datetime: clamped, still not before dueAt.
    offsets = [planned_at(IDS, "acme", f"t{i}", LATEST_DUE_AT, "P1D") - LATEST_DUE_AT for i in range(200)]
    assert all(timedelta(0) <= o < timedelta(days=1) for o in offsets)


def test_a_burst_spreads_uniformly_over_the_window() -> None:
    # 100,000 timers of one instant, a ten-minute window: ten one-minute slices.
    slices = Counter(
        (planned_at(IDS, "acme", f"birthday-{i}", DUE, "PT10M") - DUE) // timedelta(minutes=1)
        for i in range(100_000)
    )
    assert sorted(slices) == list(range(10))
    # Binomial(100,000, 0.1): a standard deviation of ~95; 6 of them is never met by chance.
    assert all(abs(n - 10_000) < 600 for n in slices.values()), slices


def test_each_occurrence_of_a_timer_has_its_own_instant() -> None:
    offsets = {planned_at(IDS, "acme", "daily", DUE + timedelta(days=k), "PT1H") - DUE - timedelta(days=k)
               for k in range(50)}  # fmt: skip
    assert len(offsets) > 45


def test_the_instant_is_keyed_by_the_fleet_secret() -> None:
    # A tenant cannot work it out (nor aim its timers at one instant) without the secret.
    other = MessageIds(bytes(32))
    differ = sum(
        planned_at(IDS, "acme", f"t{i}", DUE, "PT10M") != planned_at(other, "acme", f"t{i}", DUE, "PT10M")
        for i in range(100)
    )
    assert differ > 95


def test_no_window_is_the_due_instant_itself() -> None:
    assert planned_at(IDS, "acme", "x", DUE, "PT0S") == DUE
