"""The forms of what a tenant sends (worker.core.commands.FORMS): each one parsed from a body of its
own into a command forms_of names it by, and none that parses to no form."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from worker.contract import Subjects
from worker.core.commands import FORMS, Form, form_kind, forms_of, parse_command, parse_control

NOW = datetime(2026, 1, 1, tzinfo=UTC)
ONCE = {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": "2026-11-22T09:00:00Z"}
TENANT = {"tenantId": "acme"}
BY_ID = {"tenantId": "acme", "serviceCallId": "sc-1"}
BY_LABELS = {"tenantId": "acme", "labels": {"campaign": "bf"}}

# A body of each form the boundary parses, and the forms the command it parses to takes.
BODIES: dict[Form, tuple[dict[str, Any], set[Form]]] = {
    "schedule.once": (ONCE, {"schedule.once"}),
    "schedule.cron": ({**ONCE, "repeat": {"cron": "0 9 * * *"}}, {"schedule.cron"}),
    "schedule.every": ({**ONCE, "repeat": {"every": "PT1H"}}, {"schedule.every"}),
    "schedule.data": ({**ONCE, "data": {"order": 7}}, {"schedule.once", "schedule.data"}),
    "schedule.labels": ({**ONCE, "labels": {"campaign": "bf"}}, {"schedule.once", "schedule.labels"}),
    "schedule.window": ({**ONCE, "window": "PT10M"}, {"schedule.once", "schedule.window"}),
    "schedule.expire_after": ({**ONCE, "expireAfter": "PT1H"}, {"schedule.once", "schedule.expire_after"}),
    "cancel.id": (BY_ID, {"cancel.id"}),
    "cancel.labels": (BY_LABELS, {"cancel.labels"}),
    "pause.id": (BY_ID, {"pause.id"}),
    "pause.labels": (BY_LABELS, {"pause.labels"}),
    "pause.tenant": (TENANT, {"pause.tenant"}),
    "resume.id": (BY_ID, {"resume.id"}),
    "resume.labels": (BY_LABELS, {"resume.labels"}),
    "resume.tenant": (TENANT, {"resume.tenant"}),
}


def forms(form: Form, body: dict[str, Any]) -> frozenset[Form]:
    kind, raw = form_kind(form), json.dumps(body).encode()
    if kind == "pause" or kind == "resume":
        parsed = parse_control(kind, "acme", raw)
    else:
        assert kind == "schedule" or kind == "cancel"
        parsed = parse_command(kind, "acme", raw, now=NOW, max_horizon=timedelta(days=3650))
    assert not hasattr(parsed, "reason"), f"{form} rejected: {parsed}"
    return forms_of(parsed)  # type: ignore[arg-type]  # not a Rejection, as asserted


def test_every_form_but_the_get_has_a_body_here() -> None:
    assert set(BODIES) == FORMS - {"get"}


@pytest.mark.parametrize("form", sorted(BODIES))
def test_each_form_parses_to_a_command_of_that_form(form: Form) -> None:
    body, expected = BODIES[form]
    assert forms(form, body) == expected


def test_the_forms_are_sent_on_every_command_subject_and_the_gets() -> None:
    subjects = Subjects("svc")
    sent = {where[1] for s in subjects.commands if (where := subjects.split(s))} | {"get"}
    assert {form_kind(f) for f in FORMS} == sent


def test_a_schedule_takes_its_timing_and_each_option_it_carries() -> None:
    body = {**ONCE, "repeat": {"every": "P1D"}, "data": 1, "labels": {"a": "b"}, "window": "PT1S"}
    assert forms("schedule.every", body) == {
        "schedule.every",
        "schedule.data",
        "schedule.labels",
        "schedule.window",
    }
