"""The DLQ page's filter (worker/ops/console/dlq_views.py): whatever a client types in its fields,
a filter or one bounded line naming the field, never another exception."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.ops.console.dlq_views import FILTER_FIELDS, dlq_filter, filter_fields, sequence

fields = st.fixed_dictionaries({name: st.text(max_size=300) for name in FILTER_FIELDS})


@given(fields)
def test_any_fields_are_a_filter_or_one_bounded_line_naming_the_field(given_fields: dict[str, str]) -> None:
    shown = filter_fields(given_fields.__getitem__)
    assert all(len(v) <= 201 for v in shown.values())
    try:
        f = dlq_filter(shown.__getitem__)
    except ValueError as exc:
        line = str(exc)
        assert "\n" not in line and len(line) < 300 and line.split(":")[0] in FILTER_FIELDS, line
        return
    assert f.since is None or f.since.tzinfo is not None
    assert f.since is None or f.before is None or f.since < f.before


@given(st.text(max_size=100) | st.sampled_from(["²", "٣", "9" * 19, "007"]))
def test_an_after_is_a_sequence_or_one_line(value: str) -> None:
    try:
        seq = sequence(value)
    except ValueError as exc:
        assert str(exc).startswith("after: a DLQ sequence") and len(str(exc)) < 260
        return
    assert 0 <= seq < 2**63


def test_a_time_without_an_offset_is_utc_and_from_must_come_before_to() -> None:
    f = dlq_filter({"tenant": "", "reason": "", "id": "x", "from": "2026-12-02T09:00", "to": ""}.__getitem__)
    assert f.since == datetime(2026, 12, 2, 9, tzinfo=UTC) and f.service_call_id == "x"
    with pytest.raises(ValueError, match=r"^from: must be before to$"):
        dlq_filter({"tenant": "", "reason": "", "id": "", "from": "2026-12-02T10:00+01:00",
                    "to": "2026-12-02T09:00Z"}.__getitem__)  # fmt: skip
