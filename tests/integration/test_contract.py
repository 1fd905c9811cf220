"""The contract: docs/asyncapi.yaml's schemas hold for every example in docs/CONTRACT.md and in the
AsyncAPI file, for what a running replica really sends (DueTimeReached, `get` replies, DLQ copies),
and refuse commands the parser refuses; the reason codes are the code's. So the docs, the schemas
and the code cannot drift apart."""

from __future__ import annotations

import functools
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from jsonschema import Draft7Validator
from referencing import Registry
from referencing.jsonschema import DRAFT7

from tests.helpers import iso_in, jetstream, message_ids, publish_raw, recorder, row, running_replica, until
from worker.config import Settings
from worker.contract import REASONS, PauseTimers, Rejection
from worker.core.commands import parse_command, parse_control
from worker.core.domain import BulkAction

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ROOT / "docs" / "CONTRACT.md"
ASYNCAPI = ROOT / "docs" / "asyncapi.yaml"
URI = "urn:timer-service:asyncapi"
# Before every dueAt in the docs, so the examples are in the future and within the horizon.
NOW = datetime(2026, 1, 1, tzinfo=UTC)
HORIZON = timedelta(days=3650)


@functools.cache
def spec() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(ASYNCAPI.read_text())
    return document


@functools.cache
def schema(name: str) -> Draft7Validator:
    """The validator of components.schemas.<name>, its $refs resolved within the AsyncAPI file."""
    registry: Registry[Any] = Registry().with_resource(URI, DRAFT7.create_resource(spec()))
    return Draft7Validator({"$ref": f"{URI}#/components/schemas/{name}"}, registry=registry)


def errors(name: str, instance: Any) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in schema(name).iter_errors(instance)]


def schema_of(ref: dict[str, Any]) -> str:
    return str(ref["$ref"]).removeprefix("#/components/schemas/")


def doc_examples() -> list[tuple[str, Any]]:
    """(schema name, value) of each ```json block of CONTRACT.md, named by the marker before it."""
    text = CONTRACT.read_text()
    found = re.findall(r"<!-- schema: (\w+) -->\n```json\n(.*?)\n```", text, flags=re.DOTALL)
    # Every JSON example is tagged: an untagged one would be checked by nothing.
    assert len(found) == text.count("```json")
    return [(name, json.loads(body)) for name, body in found]


def test_the_schemas_are_json_schemas() -> None:
    assert spec()["asyncapi"].startswith("3.")
    for name, body in spec()["components"]["schemas"].items():
        Draft7Validator.check_schema(body)
        assert schema(name) is not None


def test_every_example_in_contract_md_is_valid() -> None:
    examples = doc_examples()
    assert {n for n, _ in examples} >= {
        "ScheduleTimer",
        "CancelTimer",
        "DueTimeReached",
        "DueTimeReachedHeaders",
        "GetRequest",
        "GetReply",
        "DlqHeaders",
    }
    for name, value in examples:
        assert errors(name, value) == [], (name, value)
        if name in ("ScheduleTimer", "CancelTimer"):  # the service takes it, too
            kind = "schedule" if name == "ScheduleTimer" else "cancel"
            parsed = parse_command(kind, "acme", json.dumps(value).encode(), now=NOW, max_horizon=HORIZON)
            assert not isinstance(parsed, Rejection), (value, parsed)


def test_every_example_in_asyncapi_is_valid() -> None:
    checked = 0
    for name, message in spec()["components"]["messages"].items():
        for example in message.get("examples", []):
            for part in ("payload", "headers"):
                if part in example and "$ref" in message[part]:
                    assert errors(schema_of(message[part]), example[part]) == [], (name, example["name"])
                    checked += 1
    assert checked >= 10


def test_the_reason_codes_are_the_codes() -> None:
    enum = set(spec()["components"]["schemas"]["Reason"]["enum"])
    assert enum == REASONS
    section = CONTRACT.read_text().split("\n## Reason codes\n")[1].split("\n## ")[0]
    assert set(re.findall(r"^\| `(\w+)` \|", section, flags=re.MULTILINE)) == enum


BAD_COMMANDS: list[tuple[str, Any, str]] = [
    ("ScheduleTimer", {"tenantId": "acme", "serviceCallId": "sc-1"}, "missing_field"),
    ("ScheduleTimer", {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": None}, "missing_field"),
    (
        "ScheduleTimer",
        {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": "2026-11-22T09:00:00"},
        "bad_due_at",
    ),
    (
        "ScheduleTimer",
        {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": "2026-11-22 09:00"},
        "bad_due_at",
    ),
    ("ScheduleTimer", {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": 1795338000}, "wrong_type"),
    (
        "ScheduleTimer",
        {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": "2026-11-22T09:00:00Z", "window": "P1W"},
        "bad_window",
    ),
    ("CancelTimer", {"tenantId": "acme\n", "serviceCallId": "sc-1"}, "bad_tenant"),
    ("CancelTimer", {"tenantId": "ac me", "serviceCallId": "sc-1"}, "bad_tenant"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": ""}, "bad_service_call_id"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": "x" * 201}, "bad_service_call_id"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": "a\nb"}, "bad_service_call_id"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": 42}, "wrong_type"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": "sc-1", "correlationId": ""}, "bad_correlation_id"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": "sc-1", "timestampMs": -1}, "bad_timestamp"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": "sc-1", "timestampMs": 2**63}, "bad_timestamp"),
    ("CancelTimer", {"tenantId": "acme", "serviceCallId": "sc-1", "timestampMs": 1.5}, "wrong_type"),
    ("CancelTimer", {"tenantId": "acme"}, "missing_field"),
    ("CancelTimer", ["acme", "sc-1"], "wrong_type"),
    ("CancelTimer", {"payload": {"tenantId": "acme", "serviceCallId": "sc-1"}}, "missing_field"),
    (
        "CancelTimer",
        {"type": "Bogus", "payload": {"tenantId": "acme", "serviceCallId": "sc-1"}},
        "unknown_type",
    ),
    (
        "CancelTimer",
        {"type": "ScheduleTimer", "payload": {"tenantId": "acme", "serviceCallId": "sc-1"}},
        "type_mismatch",
    ),
    (
        "ScheduleTimer",
        {"type": "ScheduleTimer", "payload": {"tenantId": "acme", "serviceCallId": "sc-1"}},
        "missing_field",
    ),
]
REPEATS: list[tuple[Any, str]] = [
    ({"every": "PT1H", "time": 3}, "bad_repeat"),
    ({"every": "PT1H", "times": 0}, "bad_repeat"),
    ({"every": 3600}, "bad_repeat"),
    ({"times": 3}, "bad_repeat"),
    ("PT1H", "bad_repeat"),
    ({"every": "PT1H", "cron": "0 9 * * *"}, "bad_repeat"),  # exactly one of them
    ({"cron": "0 0 9 * * *"}, "bad_repeat"),  # no seconds field
    ({"cron": 9}, "bad_repeat"),
    ({"cron": "0 9 * * *", "until": "2026-12-31"}, "bad_repeat"),
    ({"every": "P1D", "until": 1798675200000}, "bad_repeat"),
]
BAD_COMMANDS += [
    (
        "ScheduleTimer",
        {"tenantId": "acme", "serviceCallId": "sc-1", "dueAt": "2026-11-22T09:00:00Z", "repeat": r},
        why,
    )
    for r, why in REPEATS
]


@pytest.mark.parametrize(("name", "body", "reason"), BAD_COMMANDS)
def test_the_schemas_refuse_what_the_parser_refuses(name: str, body: Any, reason: str) -> None:
    kind = "schedule" if name == "ScheduleTimer" else "cancel"
    parsed = parse_command(kind, "acme", json.dumps(body).encode(), now=NOW, max_horizon=HORIZON)
    assert isinstance(parsed, Rejection) and parsed.reason == reason, parsed
    assert errors(name, body) != [], body


# --- what a running replica sends ---------------------------------------------------------------


async def test_a_real_due_time_reached_matches_the_schema(settings: Settings, db_url: str) -> None:
    timers = {
        "plain": None,
        'odd: id \u00e9 "quoted"': "corr-\u65e5\u672c",
        "traced": None,
        "data": None,
        "windowed": None,
    }
    # Any JSON value, delivered as an equal value (jsonb keeps neither key order nor spacing).
    data = {"n": 1, "text": '\u00e9\n"', "list": [1, 2.5, None, True], "nested": {"a": {}}}
    trace = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "X-Request-Id": "r"}
    async with (
        running_replica(settings, carry_headers="X-Request-Id"),
        recorder(settings) as rec,
        jetstream(settings) as js,
    ):
        for service_call_id, correlation_id in timers.items():
            body = {"tenantId": "acme", "serviceCallId": service_call_id, "dueAt": iso_in(-1, db_url)}
            if correlation_id is not None:
                body["correlationId"] = correlation_id
            if service_call_id == "data":
                body["data"] = data
            if service_call_id == "windowed":
                body["window"] = "PT0.2S"
            headers = trace if service_call_id == "traced" else None
            await js.publish(
                f"{settings.subject_prefix}.acme.timer.schedule", json.dumps(body).encode(), headers=headers
            )
        assert await rec.wait_for({("acme", k) for k in timers}, timeout=20)
        sub = await js.pull_subscribe(
            f"{settings.subject_prefix}.acme.timer.due", stream=settings.event_stream
        )
        msgs = await sub.fetch(len(timers), timeout=5)
    seen = {}
    ids = message_ids(db_url)
    for msg in msgs:
        event = json.loads(msg.data)
        assert errors("DueTimeReached", event) == [], event
        assert errors("DueTimeReachedHeaders", msg.headers) == [], msg.headers
        assert msg.headers is not None and msg.headers["Nats-Msg-Id"] == ids.event(event["id"])
        seen[event["payload"]["serviceCallId"]] = event["correlationId"]
        if event["payload"]["serviceCallId"] == "traced":
            assert msg.headers == {**trace, "Nats-Msg-Id": ids.event(event["id"])}
        # `data` only on the timer that had some: absent, not null, on the others.
        expected = data if event["payload"]["serviceCallId"] == "data" else "absent"
        assert event.get("data", "absent") == expected
        # plannedAt only on the timer with a window.
        windowed = event["payload"]["serviceCallId"] == "windowed"
        assert ("plannedAt" in event["payload"]) == windowed
    assert seen == timers


async def test_real_get_replies_match_the_schema(settings: Settings, db_url: str) -> None:
    prefix = settings.subject_prefix
    async with running_replica(settings), jetstream(settings) as js:
        body = {"tenantId": "acme", "serviceCallId": "sc-get", "dueAt": iso_in(3600, db_url)}
        await publish_raw(js, settings, "acme", "schedule", {**body, "repeat": {"every": "P1D", "times": 3}})
        windowed = {**body, "serviceCallId": "sc-window", "window": "PT10M"}
        await publish_raw(js, settings, "acme", "schedule", windowed)
        await until(lambda: row(db_url, "acme", "sc-get") is not None, what="the timer stored")
        await until(lambda: row(db_url, "acme", "sc-window") is not None, what="the windowed timer stored")
        nc = await nats.connect(settings.nats_url)
        try:
            replies = [
                json.loads((await nc.request(f"{prefix}.acme.timer.get", request, timeout=5)).data)
                for request in (
                    b'{"serviceCallId": "sc-get"}',
                    b'{"serviceCallId": "nope"}',
                    b"[]",
                    b'{"serviceCallId": "sc-window"}',
                )
            ]
        finally:
            await nc.close()
    for reply in replies:
        assert errors("GetReply", reply) == [], reply
    found, missing, bad, window = replies
    assert "window" not in found and "plannedAt" not in found
    assert window["window"] == "PT10M" and window["dueAt"] <= window["plannedAt"]
    assert found["state"] == "Scheduled"
    assert found["repeat"] == {"every": "P1D", "cron": None, "times": 3, "until": None, "timezone": None}
    assert found["data"] is None
    assert missing == {"error": "not_found", "tenantId": "acme", "serviceCallId": "nope"}
    assert bad["error"] == "bad_request"


async def test_a_real_dlq_copy_matches_the_schema(settings: Settings) -> None:
    bad = b'{"tenantId": "acme", "serviceCallId": "sc-dlq", "dueAt": "2026-11-22 09:00"}'
    async with running_replica(settings), jetstream(settings) as js:
        await publish_raw(js, settings, "acme", "schedule", bad)
        sub = await js.pull_subscribe(f"{settings.subject_prefix}.acme.timer.dlq", stream=settings.dlq_stream)
        (copy,) = await sub.fetch(1, timeout=20)
    assert errors("DlqHeaders", copy.headers) == [], copy.headers
    assert copy.headers is not None and copy.headers["Timer-Error"] == "bad_due_at"
    assert copy.data == bad


def test_pause_and_resume_examples_are_valid_and_taken_and_bad_ones_refused_by_both() -> None:
    taken = 0
    for name, kind in (("PauseTimers", "pause"), ("ResumeTimers", "resume")):
        for example in spec()["components"]["messages"][name]["examples"]:
            assert errors(name, example["payload"]) == [], example["name"]
            parsed = parse_control(kind, "acme", json.dumps(example["payload"]).encode())  # type: ignore[arg-type]
            if "labels" in example["payload"]:  # a bulk action (docs/CONTRACT.md, Labels)
                assert isinstance(parsed, BulkAction) and parsed.kind == kind, parsed
            else:
                assert isinstance(parsed, PauseTimers) and parsed.resume == (kind == "resume"), parsed
            taken += 1
    assert taken >= 4
    bad: list[tuple[Any, str]] = [
        ({}, "missing_field"),
        ({"tenantId": "acme", "serviceCallId": ""}, "bad_service_call_id"),
        ({"tenantId": "acme", "serviceCallId": 7}, "wrong_type"),
        ({"type": "PauseTimers", "payload": {"tenantId": "acme"}}, "type_mismatch"),  # on resume
        ({"tenantId": "acme", "labels": {}}, "bad_labels"),
        ({"tenantId": "acme", "labels": {"Campaign": "x"}}, "bad_labels"),
        ({"tenantId": "acme", "labels": {"campaign": "x"}, "serviceCallId": "sc-1"}, "bad_labels"),
    ]
    for body, reason in bad:
        assert errors("ResumeTimers", body) != [], body
        parsed = parse_control("resume", "acme", json.dumps(body).encode())
        assert isinstance(parsed, Rejection) and parsed.reason == reason, (body, parsed)
    # The subject's tenant must be the body's: a tenant pauses only its own timers.
    other = parse_control("pause", "mallory", b'{"tenantId": "acme"}')
    assert isinstance(other, Rejection) and other.reason == "tenant_mismatch"
