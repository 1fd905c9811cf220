"""The validation boundary's fast paths (issue 21: intake reads thousands of commands a second)
give what the general paths give: a dueAt in Z is the same instant as the same one written with
an offset, and an id is accepted or refused the same with or without the per-character lookup."""

from __future__ import annotations

import unicodedata
from datetime import UTC, datetime, timedelta, timezone

from hypothesis import given
from hypothesis import strategies as st

from worker.core.fields import _due_at, _identifier, _Reject

INSTANTS = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(9998, 12, 31), timezones=st.just(UTC)
)
OFFSETS = st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59)


def written(instant: datetime, offset_minutes: int | None, digits: int) -> str:
    local = (
        instant if offset_minutes is None else instant.astimezone(timezone(timedelta(minutes=offset_minutes)))
    )
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{local.microsecond:06d}{'789' * 3}"[:digits]
    if offset_minutes is None:
        return text + "Z"
    sign = "-" if offset_minutes < 0 else "+"
    return text + f"{sign}{abs(offset_minutes) // 60:02d}:{abs(offset_minutes) % 60:02d}"


@given(INSTANTS, OFFSETS, st.integers(min_value=0, max_value=9))
def test_a_due_at_in_z_and_with_an_offset_is_one_instant(instant: datetime, offset: int, digits: int) -> None:
    z, shifted = _due_at(written(instant, None, digits)), _due_at(written(instant, offset, digits))
    assert z == shifted
    assert z.tzinfo is UTC and shifted.tzinfo is UTC
    kept = min(digits, 6)
    assert z == instant.replace(microsecond=instant.microsecond // 10 ** (6 - kept) * 10 ** (6 - kept))


def _slow(value: str) -> bool:
    return not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in value)


@given(st.text(min_size=1, max_size=50))
def test_an_id_is_refused_exactly_when_it_holds_a_control_character_or_lone_surrogate(value: str) -> None:
    try:
        _identifier(value, "serviceCallId", "bad_service_call_id")
        accepted = True
    except _Reject:
        accepted = False
    assert accepted == _slow(value)
