"""Store reads claim_due's rows by the names of its columns (worker/adapters/postgres/claim.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from worker.adapters.postgres.claim import claim_result, recorded_ids
from worker.core.domain import Claimed, Unreadable
from worker.errors import DatabaseError

NOW = datetime(2030, 1, 1, tzinfo=UTC)
DUE = NOW - timedelta(seconds=1)
ROW = {
    "tenant_id": "acme",
    "service_call_id": "k",
    "due_at": DUE,
    "correlation_id": "c",
    "lease_token": 7,
    "attempts": 1,
    "recorded": True,
    "repeat_every": None,
    "repeat_times": None,
    "repeat_timezone": None,
    "anchor_due_at": DUE,
    "occurrence_index": 0,
    "recurrence_ref": DUE,
    "row_id": "(0,1)",
    "carried": {"traceparent": "x"},
    "repeat_cron": "* * * * *",
    "repeat_until": None,
    "data": '{"a": 1}',
    "nominal_due_at": None,
    "fire_window": None,
    "expire_after": None,
    "repeat_catchup": None,
    "caught_up": None,
    "labels": '{"campaign": "bf"}',
    "next_due_at": NOW + timedelta(seconds=2),
    "db_now": NOW,
}


def rows(names: list[str], *dicts: dict[str, object]) -> list[tuple[object, ...]]:
    return [tuple(d[n] for n in names) for d in dicts]


def test_columns_are_read_by_name_whatever_their_order_and_an_extra_one_shifts_nothing() -> None:
    names = ["db_now", "new_column", *reversed([n for n in ROW if n != "db_now"])]
    unreadable = ROW | {"service_call_id": "bad", "due_at": None}
    result = claim_result(names, rows(names, ROW | {"new_column": 1}, unreadable | {"new_column": 2}))
    (claimed,) = result.claimed
    assert claimed == Claimed(*(ROW[f] for f in Claimed._fields))
    assert claimed.carried == {"traceparent": "x"} and claimed.data == '{"a": 1}'
    assert result.unreadable == [Unreadable("acme", "bad", 7, 1, "(0,1)")]
    assert result.next_due_in_ms == 2000 and result.db_now == NOW


def test_a_claim_that_took_nothing_reads_its_one_row_of_nulls() -> None:
    names = list(ROW)
    empty = dict.fromkeys(ROW) | {"next_due_at": None, "db_now": NOW}
    result = claim_result(names, rows(names, empty))
    assert result.claimed == [] and result.unreadable == [] and result.next_due_in_ms is None


def test_a_missing_column_fails_the_claim_naming_it() -> None:
    names = [n for n in ROW if n not in ("recurrence_ref", "db_now")]
    with pytest.raises(DatabaseError, match="recurrence_ref, db_now"):
        claim_result(names, rows(names, ROW))


def test_the_occurrences_the_claim_recorded_are_read_by_name_too() -> None:
    names = list(ROW)
    leased = ROW | {"row_id": "(0,2)", "recorded": False}
    assert recorded_ids(names, rows(names, ROW, leased)) == {"(0,1)"}
    without = [n for n in names if n != "recorded"]
    with pytest.raises(DatabaseError, match="recorded"):
        recorded_ids(without, rows(without, ROW))
