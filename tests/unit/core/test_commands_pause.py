"""PauseTimers/ResumeTimers parsing never widens a timer's pause to its whole tenant (issue 23, review)."""

from __future__ import annotations

from worker.contract import Rejection
from worker.core.commands import parse_control


# Issue 23 review, defect 5: a pause meant for one timer pauses the whole tenant. A JSON null counts as
# absent, and a serviceCallId outside the envelope's payload is an unknown key, ignored; either way
# the command has no serviceCallId, which means "every timer of the tenant". A producer bug
# (serializing a None id, or the id at the wrong level) silently pauses everything. Root cause:
# worker/core/commands.py _parse_control (`_optional(fields, "serviceCallId", str)`).
def test_a_null_service_call_id_does_not_pause_the_whole_tenant() -> None:
    parsed = parse_control("pause", "acme", b'{"tenantId": "acme", "serviceCallId": null}')
    assert isinstance(parsed, Rejection) or parsed.service_call_id is not None


def test_a_service_call_id_beside_the_envelope_payload_does_not_pause_the_whole_tenant() -> None:
    body = b'{"type": "PauseTimers", "serviceCallId": "sc-42", "payload": {"tenantId": "acme"}}'
    parsed = parse_control("pause", "acme", body)
    assert isinstance(parsed, Rejection) or parsed.service_call_id == "sc-42"


def test_a_null_or_misplaced_service_call_id_is_refused_with_a_reason_naming_the_field() -> None:
    for body in (
        b'{"tenantId": "acme", "serviceCallId": null}',
        b'{"type": "ResumeTimers", "serviceCallId": "sc-42", "payload": {"tenantId": "acme"}}',
    ):
        parsed = parse_control("resume" if b"Resume" in body else "pause", "acme", body)
        assert isinstance(parsed, Rejection), body
        assert parsed.reason == "bad_service_call_id" and "serviceCallId" in parsed.detail


def test_a_pause_without_a_service_call_id_is_still_the_whole_tenant() -> None:
    parsed = parse_control("pause", "acme", b'{"type": "PauseTimers", "payload": {"tenantId": "acme"}}')
    assert not isinstance(parsed, Rejection) and parsed.service_call_id is None
