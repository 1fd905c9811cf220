"""The console's actions end to end (worker/ops/console/actions.py; issue 23): pause and resume a
tenant or one timer, and a reschedule or fire-now that keeps what the timer carries to its events,
with a real replica applying what the console sent, on real Postgres and NATS."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.helpers import due_events, iso_in, jetstream, query, row, running_replica, until
from tests.integration.ops.test_console import _login, console_settings
from worker.config import Settings
from worker.ops.console.app import create_app

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@contextlib.contextmanager
def console(settings: Settings, actions: bool = True) -> Iterator[tuple[TestClient, str]]:
    """A logged-in console (its own thread and NATS connection) and the session's CSRF token."""
    app = create_app(console_settings(settings, console_actions=actions))
    with TestClient(app, follow_redirects=False) as c:
        yield c, _login(c)


def _audited(caplog: pytest.LogCaptureFixture) -> list[tuple[Any, ...]]:
    return [
        (r.what, r.tenant, r.id, r.user)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "action", None) == "console_action"
    ]


def _tenant_paused(db_url: str, tenant: str) -> bool:
    return query(
        db_url, "SELECT count(*) FROM paused_tenants WHERE tenant_id = %s AND paused_at IS NOT NULL", tenant
    ) == [(1,)]


def _states(db_url: str, tenant: str) -> dict[str, str]:
    rows = query(db_url, "SELECT service_call_id, state FROM timers WHERE tenant_id = %s", tenant)
    return {sid: state for sid, state in rows}


async def _schedule(js: Any, settings: Settings, body: dict[str, Any], headers: dict[str, str]) -> None:
    subject = f"{settings.subject_prefix}.{body['tenantId']}.timer.schedule"
    await js.publish(subject, json.dumps(body).encode(), headers=headers)


async def test_pause_and_resume_a_tenant_and_a_timer_from_the_console(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.ops.console")
    async with running_replica(settings), jetstream(settings) as js:
        for sid in ("one", "two"):
            await _schedule(
                js, settings, {"tenantId": "acme", "serviceCallId": sid, "dueAt": iso_in(3600)}, {}
            )
        await until(lambda: len(_states(db_url, "acme")) == 2, what="timers stored")
        with console(settings, actions=False) as (off, csrf):
            page = off.get("/tenants/acme").text
            assert "Pause tenant" not in page and "Not paused" in page
            assert "Pause…" not in off.get("/timers/acme/one").text
            for path in ("/act-tenant/pause/acme", "/act/pause/acme/one"):
                assert off.post(path, data={"csrf": csrf, "confirm": "yes"}).status_code == 403

        with console(settings) as (on, csrf):
            assert "Pause tenant…" in on.get("/tenants/acme").text
            # No CSRF token, a forged one: refused, nothing sent.
            assert on.post("/act-tenant/pause/acme", data={"confirm": "yes"}).status_code == 403
            forged = {"csrf": "forged", "confirm": "yes"}
            assert on.post("/act/pause/acme/one", data=forged).status_code == 403
            # Confirmed first: the question sends nothing and audits nothing.
            asked = on.post("/act-tenant/pause/acme", data={"csrf": csrf})
            assert asked.status_code == 200 and "Yes, pause" in asked.text and "not paused" in asked.text
            assert on.post("/act-tenant/resume/acme", data={"csrf": csrf}).status_code == 409  # not paused
            assert on.post("/act/resume/acme/one", data={"csrf": csrf}).status_code == 409  # not paused
            assert _audited(caplog) == [] and not _tenant_paused(db_url, "acme")

            done = on.post("/act-tenant/pause/acme", data={"csrf": csrf, "confirm": "yes"})
            assert done.status_code == 303 and done.headers["location"] == "/tenants/acme?done=pause"
            await until(
                lambda: (
                    _tenant_paused(db_url, "acme")
                    and _states(db_url, "acme") == {"one": "Paused", "two": "Paused"}
                ),
                what="the tenant's pause applied",
            )
            tenant_page = on.get("/tenants/acme?done=pause").text
            assert "PauseTimers sent" in tenant_page and "<b>Paused</b> since" in tenant_page
            with_tenant = on.get("/timers/acme/two").text
            assert 'id="paused-with-tenant"' in with_tenant and "Resume…" not in with_tenant
            refused = on.post("/act/resume/acme/two", data={"csrf": csrf})
            assert refused.status_code == 409 and "resume the tenant" in refused.text

            # One timer paused by itself outlives its tenant's resume, until its own.
            assert on.post("/act/pause/acme/one", data={"csrf": csrf}).status_code == 200
            moved = on.post("/act/pause/acme/one", data={"csrf": csrf, "confirm": "yes"})
            assert moved.status_code == 303 and moved.headers["location"] == "/timers/acme/one?done=pause"
            await until(
                lambda: (row(db_url, "acme", "one") or {}).get("paused_at") is not None, what="one paused"
            )
            assert "Resume…" in on.get("/timers/acme/one").text
            resumed = on.post("/act-tenant/resume/acme", data={"csrf": csrf, "confirm": "yes"})
            assert resumed.status_code == 303
            await until(
                lambda: (
                    not _tenant_paused(db_url, "acme")
                    and _states(db_url, "acme") == {"one": "Paused", "two": "Scheduled"}
                ),
                what="the tenant's resume applied",
            )
            assert "Not paused" in on.get("/tenants/acme").text
            assert on.post("/act/resume/acme/one", data={"csrf": csrf, "confirm": "yes"}).status_code == 303
            await until(
                lambda: _states(db_url, "acme") == {"one": "Scheduled", "two": "Scheduled"},
                what="one resumed",
            )
            assert "Pause…" in on.get("/timers/acme/one").text
    assert (row(db_url, "acme", "one") or {})["paused_at"] is None
    assert _audited(caplog) == [
        ("tenant_pause", "acme", None, "token"),
        ("pause", "acme", "one", "token"),
        ("tenant_resume", "acme", None, "token"),
        ("resume", "acme", "one", "token"),
    ]


async def test_a_timer_rescheduled_or_fired_from_the_console_keeps_its_carried_headers_and_data(
    settings: Settings, db_url: str
) -> None:
    """The console sends a ScheduleTimer for them; without the timer's trace context and producer
    headers on it (and its data in it), the upsert would store none and its events carry none."""
    headers = {"traceparent": TRACEPARENT, "tracestate": "vendor=opaque", "X-Request-Id": "req-7"}
    async with running_replica(settings, carry_headers="X-Request-Id"), jetstream(settings) as js:
        for sid in ("fired", "moved"):
            body = {"tenantId": "acme", "serviceCallId": sid, "dueAt": iso_in(3600), "data": {"order": sid}}
            await _schedule(js, settings, body, headers)
        await until(
            lambda: all((row(db_url, "acme", s) or {}).get("carried_headers") for s in ("fired", "moved")),
            what="timers stored with their headers",
        )
        with console(settings) as (on, csrf):
            assert on.post("/act/fire/acme/fired", data={"csrf": csrf, "confirm": "yes"}).status_code == 303
            due = iso_in(1, db_url)
            moved = on.post("/act/reschedule/acme/moved", data={"csrf": csrf, "confirm": "yes", "dueAt": due})
            assert moved.status_code == 303
            events = await due_events(js, settings, 2)
    assert sorted(e["payload"]["serviceCallId"] for e, _ in events) == ["fired", "moved"]
    for event, got in events:
        assert event["data"] == {"order": event["payload"]["serviceCallId"]}
        assert {k: v for k, v in got.items() if k != "Nats-Msg-Id"} == headers
