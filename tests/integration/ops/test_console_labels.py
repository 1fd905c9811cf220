"""The console's label filter and bulk actions (worker/ops/console/actions.py, labelled_action;
browse.py, tenant_page and labelled_count): a tenant's timers carrying every pair of the filter,
and a cancel, pause or resume of all of them, confirmed and audited, applied by a real replica."""

from __future__ import annotations

import logging

import pytest

from tests.helpers import iso_in, jetstream, running_replica, until
from tests.integration.ops.test_console_actions import _audited, _schedule, _states, console
from worker.config import Settings


async def test_a_label_filter_lists_and_a_bulk_action_acts_on_the_tenants_timers_carrying_it(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.ops.console")
    async with running_replica(settings), jetstream(settings) as js:
        for tenant, sid, labels in (
            ("acme", "bf-1", {"campaign": "bf", "tier": "gold"}),
            ("acme", "bf-2", {"campaign": "bf"}),
            ("acme", "other", {"campaign": "xmas"}),
            ("globex", "bf-1", {"campaign": "bf", "tier": "gold"}),
        ):
            body = {"tenantId": tenant, "serviceCallId": sid, "dueAt": iso_in(3600), "labels": labels}
            await _schedule(js, settings, body, {})
        await until(lambda: len(_states(db_url, "acme")) == 3 and _states(db_url, "globex"), what="stored")
        with console(settings, actions=False) as (off, csrf):
            page = off.get("/tenants/acme?label=campaign%3Dbf").text
            assert "bf-1" in page and "bf-2" in page and ">other<" not in page
            assert "every timer labelled" not in page
            assert (
                off.post("/act-labelled/cancel/acme", data={"csrf": csrf, "label": "campaign=bf"}).status_code
                == 403
            )
        with console(settings) as (on, csrf):
            assert on.get("/tenants/acme?label=Campaign%3Dbf").status_code == 400  # the service's rule
            both = on.get("/tenants/acme?label=campaign%3Dbf&label=tier%3Dgold").text
            assert "bf-1" in both and "bf-2" not in both and "Cancel every timer labelled" in both
            form = {"csrf": csrf, "label": ["campaign=bf", "tier=gold"]}
            asked = on.post("/act-labelled/cancel/acme", data=form)
            assert (
                asked.status_code == 200
                and "Yes, cancel" in asked.text
                and "1 Scheduled or paused timer " in asked.text
            )
            assert _audited(caplog) == []  # the question sends nothing
            done = on.post("/act-labelled/cancel/acme", data={**form, "confirm": "yes"})
            assert done.status_code == 303
            assert (
                done.headers["location"]
                == "/tenants/acme?label=campaign%3Dbf&label=tier%3Dgold&done=labelled_cancel"
            )
            await until(lambda: _states(db_url, "acme")["bf-1"] == "Cancelled", what="the bulk cancel")
            paused = on.post(
                "/act-labelled/pause/acme", data={"csrf": csrf, "label": "campaign=bf", "confirm": "yes"}
            )
            assert paused.status_code == 303
            await until(lambda: _states(db_url, "acme")["bf-2"] == "Paused", what="the bulk pause")
    assert _states(db_url, "acme") == {"bf-1": "Cancelled", "bf-2": "Paused", "other": "Scheduled"}
    assert _states(db_url, "globex") == {"bf-1": "Scheduled"}
    audited = [(what, tenant) for what, tenant, _, _ in _audited(caplog)]
    assert audited == [("labelled_cancel", "acme"), ("labelled_pause", "acme")]
    (line,) = [r for r in caplog.records if getattr(r, "what", None) == "labelled_cancel"]
    assert line.labels == {"campaign": "bf", "tier": "gold"}  # type: ignore[attr-defined]
