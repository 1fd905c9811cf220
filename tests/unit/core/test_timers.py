"""A stored timer, typed (worker/core/timers.py): read by name, shown as the contract says."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from worker.core.timers import StoredTimer, stored_timer, timer_view

T0 = datetime(2030, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
ROW: dict[str, Any] = {
    "tenant_id": "acme",
    "service_call_id": "sc-1",
    "state": "Paused",
    "due_at": T0,
    "registered_at": T0,
    "updated_at": T0,
    "reached_at": None,
    "correlation_id": "c-1",
    "attempts": 0,
    "last_error": None,
    "lease_owner": None,
    "lease_expires_at": None,
    "repeat_every": None,
    "repeat_times": None,
    "repeat_timezone": None,
    "anchor_due_at": T0,
    "occurrence_index": 0,
    "fired_count": 2,
    "repeat_cron": "0 * * * *",
    "repeat_until": None,
    "data": {"k": 1},
    "nominal_due_at": None,
    "fire_window": None,
    "expire_after": None,
    "repeat_catchup": None,
    "labels": {"campaign": "bf"},
}


def test_a_row_is_read_by_column_name_whatever_else_it_holds() -> None:
    timer = stored_timer({"db_now": T0, "overdue": False, **dict(reversed(ROW.items()))})
    assert timer.service_call_id == "sc-1" and timer.due_at == T0 and timer.data == {"k": 1}


def test_a_row_without_a_column_is_refused_naming_it() -> None:
    with pytest.raises(KeyError, match="registered_at"):
        stored_timer({k: v for k, v in ROW.items() if k != "registered_at"})


def test_a_paused_timer_shows_as_scheduled_and_paused_with_its_times_in_rfc3339() -> None:
    view = timer_view(stored_timer(ROW))
    assert view["state"] == "Scheduled" and view["paused"] is True
    assert view["dueAt"] == view["nextOccurrence"] == view["registeredAt"] == "2030-01-02T03:04:05.678Z"
    assert view["repeat"] == {
        "every": None,
        "cron": "0 * * * *",
        "times": None,
        "until": None,
        "timezone": None,
    }
    assert view["occurrencesFired"] == 2 and view["data"] == {"k": 1}
    assert view["labels"] == {"campaign": "bf"}


def test_a_timer_without_labels_shows_an_empty_object() -> None:
    assert timer_view(replace(stored_timer(ROW), labels=None))["labels"] == {}


def test_a_finished_timer_has_no_next_occurrence() -> None:
    view = timer_view(replace(stored_timer(ROW), state="Reached", reached_at=T0, repeat_cron=None))
    assert view["state"] == "Reached" and view["nextOccurrence"] is None and view["repeat"] is None
    assert isinstance(stored_timer(ROW), StoredTimer)
