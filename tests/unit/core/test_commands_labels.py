"""Labels at the validation boundary (docs/CONTRACT.md, Labels): a ScheduleTimer's labels, and a
cancel's, pause's or resume's selector; each bad one refused as bad_labels with a reason, and no
accepted labels print, as stored, past the event bound's widest ones."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from worker.contract import (
    LATEST_DUE_AT,
    MAX_ID_CHARS,
    MAX_LABEL_VALUE_CHARS,
    MAX_LABELS,
    MessageIds,
    Rejection,
    ScheduleTimer,
    data_json,
    due_event,
    iso,
    wire_size,
)
from worker.core.commands import parse_command, parse_control
from worker.core.domain import BulkAction
from worker.core.eventsize import OccurrenceValues, largest_event
from worker.core.fields import label_problem

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FLAT = {"tenantId": "acme", "serviceCallId": "sc-42", "dueAt": "2026-11-22T09:00:00Z"}


def schedule(labels: Any) -> ScheduleTimer | Rejection:
    body = json.dumps({**FLAT, "labels": labels}).encode()
    parsed = parse_command("schedule", "acme", body, now=NOW, max_horizon=timedelta(days=3650))
    assert not isinstance(parsed, BulkAction)
    return parsed  # type: ignore[return-value]


def test_labels_are_kept_as_given() -> None:
    parsed = schedule({"campaign": "black-friday", "tier.v2_x-1": "", "émoji": "x"} | {"emoji": "🎉 ok"})
    assert isinstance(parsed, Rejection)  # "émoji": a key outside [a-z0-9_.-]
    parsed = schedule({"campaign": "black-friday", "tier.v2_x-1": "", "emoji": "🎉 ok"})
    assert isinstance(parsed, ScheduleTimer)
    assert parsed.labels == {"campaign": "black-friday", "tier.v2_x-1": "", "emoji": "🎉 ok"}


def test_no_labels_and_empty_labels_are_none() -> None:
    for labels in (None, {}):
        parsed = schedule(labels)
        assert isinstance(parsed, ScheduleTimer) and parsed.labels is None


@pytest.mark.parametrize(
    ("labels", "detail"),
    [
        (["campaign"], "labels must be an object, not an array"),
        ("campaign=x", "labels must be an object, not a string"),
        ({f"k{i}": "v" for i in range(MAX_LABELS + 1)}, f"labels has 17 pairs, more than {MAX_LABELS}"),
        ({"": "v"}, "label key '' does not match"),
        ({"Campaign": "v"}, "label key 'Campaign' does not match"),
        ({"a" * 64: "v"}, "does not match [a-z0-9_.-]{1,63}"),
        ({"a=b": "v"}, "label key 'a=b' does not match"),
        ({"campaign": 7}, "label campaign must be a string, not an integer"),
        ({"campaign": None}, "label campaign must be a string, not null"),
        ({"campaign": "x" * (MAX_LABEL_VALUE_CHARS + 1)}, "label campaign has 201 characters, more than 200"),
        ({"campaign": "a\nb"}, "label campaign holds a control character or lone surrogate"),
        ({"campaign": "a\x00b"}, "label campaign holds a control character or lone surrogate"),
    ],
)
def test_bad_labels_are_refused_with_a_reason(labels: Any, detail: str) -> None:
    parsed = schedule(labels)
    assert isinstance(parsed, Rejection) and parsed.reason == "bad_labels", parsed
    assert detail in parsed.detail


def test_a_lone_surrogate_in_a_value_is_refused() -> None:
    body = json.dumps(FLAT)[:-1].encode() + b', "labels": {"k": "\\ud800"}}'
    parsed = parse_command("schedule", "acme", body, now=NOW, max_horizon=timedelta(days=3650))
    assert isinstance(parsed, Rejection) and parsed.reason == "bad_labels"


def test_a_cancel_naming_labels_is_a_bulk_action_of_its_tenant() -> None:
    body = b'{"tenantId": "acme", "labels": {"campaign": "black-friday"}, "timestampMs": 5}'
    parsed = parse_command("cancel", "acme", body, now=NOW, max_horizon=timedelta(days=1))
    assert parsed == BulkAction("acme", {"campaign": "black-friday"}, "cancel", None, 5)


@pytest.mark.parametrize("kind", ["pause", "resume"])
def test_a_pause_or_resume_naming_labels_is_a_bulk_action(kind: str) -> None:
    name = "PauseTimers" if kind == "pause" else "ResumeTimers"
    body = json.dumps(
        {"type": name, "correlationId": "c", "payload": {"tenantId": "acme", "labels": {"a": "1", "b": "2"}}}
    )
    parsed = parse_control(kind, "acme", body.encode())  # type: ignore[arg-type]
    assert parsed == BulkAction("acme", {"a": "1", "b": "2"}, kind, "c")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "body", "detail"),
    [
        ("pause", {"tenantId": "acme", "labels": {}}, "labels is empty"),
        ("cancel", {"tenantId": "acme", "labels": {}}, "labels is empty"),
        ("pause", {"tenantId": "acme", "labels": None}, "labels is null"),
        ("resume", {"tenantId": "acme", "labels": None}, "labels is null"),
        ("cancel", {"tenantId": "acme", "labels": {"a": "1"}, "serviceCallId": "x"}, "not both"),
        ("pause", {"tenantId": "acme", "labels": {"a": "1"}, "serviceCallId": "x"}, "not both"),
        ("pause", {"type": "PauseTimers", "labels": {"a": "1"}, "payload": {"tenantId": "acme"}}, "envelope"),
        ("resume", {"tenantId": "acme", "labels": {"A": "1"}}, "does not match"),
    ],
)
def test_a_selector_never_widens_to_the_whole_tenant(kind: str, body: dict[str, Any], detail: str) -> None:
    """An empty, null or misplaced selector would name every timer of the tenant: refused, as a
    null serviceCallId is (a producer bug never widens an action)."""
    raw = json.dumps(body).encode()
    if kind == "cancel":
        parsed: object = parse_command("cancel", "acme", raw, now=NOW, max_horizon=timedelta(days=1))
    else:
        parsed = parse_control(kind, "acme", raw)  # type: ignore[arg-type]
    assert isinstance(parsed, Rejection) and parsed.reason == "bad_labels", parsed
    assert detail in parsed.detail


def test_a_selector_names_only_its_subject_tenant() -> None:
    parsed = parse_control("pause", "acme", b'{"tenantId": "other", "labels": {"a": "1"}}')
    assert isinstance(parsed, Rejection) and parsed.reason == "tenant_mismatch"


def test_label_problem_is_the_rule_of_the_boundary() -> None:
    assert label_problem({"campaign": "bf"}) is None
    assert label_problem({"Campaign": "bf"}) is not None
    assert label_problem({}) is not None


keys = st.from_regex(r"[a-z0-9_.-]{1,63}", fullmatch=True)
values = st.text(st.characters(codec="utf-8"), max_size=MAX_LABEL_VALUE_CHARS + 5)


@settings(derandomize=True, database=None, max_examples=400)
@given(labels=st.dictionaries(keys | st.text(max_size=70), values, max_size=MAX_LABELS + 2))
def test_accepted_labels_print_within_the_widest(labels: dict[str, str]) -> None:
    """Whatever a tenant sends (count, key and value lengths, any Unicode, quotes and backslashes to
    escape), labels the boundary accepts print, as Postgres stores and the events carry them,
    within the widest labels that contract.largest_event counts; and so does their event."""
    parsed = schedule(labels)
    if isinstance(parsed, Rejection):
        assert parsed.reason == "bad_labels"
        return
    text = None if parsed.labels is None else data_json(parsed.labels)
    assert text is None or len(text.encode()) <= widest_bytes()
    widest_id = "\U0010ffff" * MAX_ID_CHARS
    timer = OccurrenceValues("t" * 64, widest_id, LATEST_DUE_AT, widest_id, None, None, labels=text)
    event = due_event(timer, "s", iso(LATEST_DUE_AT), 0, MessageIds(bytes(16)))
    assert wire_size(event) <= largest_event(0, set())
    if text is not None:
        assert json.loads(event.payload)["labels"] == parsed.labels


def widest_bytes() -> int:
    widest = {f"{i:02d}".ljust(63, "k"): "\U0010ffff" * MAX_LABEL_VALUE_CHARS for i in range(MAX_LABELS)}
    return len(data_json(widest).encode())
