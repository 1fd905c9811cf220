"""The console's label filter and bulk actions (worker/ops/console/bulk.py; browse.py, tenant_page
and labelled_count): a tenant's timers carrying every pair of the filter, and a cancel, pause or
resume of all of them, offered only where the filter's state allows, confirmed once, audited with
the filter and the count, applied by a real replica."""

from __future__ import annotations

import logging
import re
from html.parser import HTMLParser
from typing import Any

import pytest

from tests.helpers import iso_in, jetstream, running_replica, until
from tests.integration.ops.test_console_actions import _audited, _schedule, _states, console
from worker.config import Settings
from worker.ops.console.bulk import BAD_LABEL

# A label value as hostile as the rule lets a tenant make it: markup, both quotes, an ampersand.
HOSTILE = '<b onmouseover="x()">it\'s</b>&amp;'


class _Form(HTMLParser):
    """The fields of a page's last form, as a browser would post them (entities decoded)."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.fields: list[tuple[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form":
            self.fields = []
        elif tag == "input" and a.get("name"):
            self.fields.append((a["name"] or "", a.get("value") or ""))


def _posted(fields: list[tuple[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in fields:
        if name == "label":
            out.setdefault("label", []).append(value)
        else:
            out[name] = value
    return out


def _bulk_lines(caplog: pytest.LogCaptureFixture, kind: str) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if getattr(r, "action", None) == "bulk_applied" and getattr(r, "kind", None) == kind
    ]


async def _store(
    js: Any, settings: Settings, db_url: str, timers: list[tuple[str, str, dict[str, str]]]
) -> None:
    for tenant, sid, labels in timers:
        body = {"tenantId": tenant, "serviceCallId": sid, "dueAt": iso_in(3600), "labels": labels}
        await _schedule(js, settings, body, {})
    last_tenant, last_sid, _ = timers[-1]
    await until(lambda: last_sid in _states(db_url, last_tenant), what="timers stored")


async def test_a_label_filter_lists_and_a_bulk_action_acts_once_on_the_tenants_timers_carrying_it(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker")
    async with running_replica(settings), jetstream(settings) as js:
        await _store(js, settings, db_url, [
            ("acme", "bf-1", {"campaign": "bf", "tier": "gold"}),
            ("acme", "bf-2", {"campaign": "bf"}),
            ("acme", "other", {"campaign": "xmas"}),
            ("globex", "bf-1", {"campaign": "bf", "tier": "gold"}),
        ])  # fmt: skip
        with console(settings, actions=False) as (off, csrf):
            page = off.get("/tenants/acme?label=campaign%3Dbf").text
            assert "bf-1" in page and "bf-2" in page and ">other<" not in page
            assert "matching…" not in page
            refused = off.post("/act-labelled/cancel/acme", data={"csrf": csrf, "label": "campaign=bf"})
            assert refused.status_code == 403
        with console(settings) as (on, csrf):
            assert on.get("/tenants/acme?label=Campaign%3Dbf").status_code == 400  # the service's rule
            both = on.get("/tenants/acme?label=campaign%3Dbf&label=tier%3Dgold").text
            assert "bf-1" in both and "bf-2" not in both and "Cancel all 1 matching…" in both
            form = {"csrf": csrf, "label": ["campaign=bf", "tier=gold"]}
            asked = on.post("/act-labelled/cancel/acme", data=form)
            assert asked.status_code == 200 and "Yes, cancel them" in asked.text
            why = re.search(r'id="why">(.*?)</p>', asked.text)
            assert why and "<code>campaign=bf</code> <code>tier=gold</code>" in why.group(1)
            assert "Now 1 Scheduled or paused timer of acme matches it." in why.group(1)
            assert _audited(caplog) == []  # the question sends nothing
            # A confirmation is the one the console gave: without it, or made up, nothing is sent.
            for once in ({}, {"once": "made-up"}):
                unasked = on.post("/act-labelled/cancel/acme", data={**form, "confirm": "yes", **once})
                assert unasked.status_code == 409 and "nothing was sent" in unasked.text
            confirm = _posted(_Form(asked.text).fields)
            done = on.post("/act-labelled/cancel/acme", data=confirm)
            assert done.status_code == 303
            assert (
                done.headers["location"]
                == "/tenants/acme?label=campaign%3Dbf&label=tier%3Dgold&done=labelled_cancel"
            )
            again = on.post("/act-labelled/cancel/acme", data=confirm)  # a double click, a reload
            assert again.status_code == 409 and "nothing was sent again" in again.text
            await until(lambda: _states(db_url, "acme")["bf-1"] == "Cancelled", what="the bulk cancel")
            paused = on.post(
                "/act-labelled/pause/acme", data=_posted(_Form(on.post(
                    "/act-labelled/pause/acme", data={"csrf": csrf, "label": "campaign=bf"}
                ).text).fields),
            )  # fmt: skip
            assert paused.status_code == 303
            await until(lambda: _states(db_url, "acme")["bf-2"] == "Paused", what="the bulk pause")
        # A timer scheduled after those commands: once it is stored, every command before it was
        # applied (one tenant's commands apply in stream order), a second cancel too, had it been sent.
        await _store(js, settings, db_url, [("acme", "bf-late", {"campaign": "bf"})])
    assert _states(db_url, "acme") == {
        "bf-1": "Cancelled", "bf-2": "Paused", "other": "Scheduled", "bf-late": "Scheduled"
    }  # fmt: skip
    assert _states(db_url, "globex") == {"bf-1": "Scheduled"}
    assert len(_bulk_lines(caplog, "cancel")) == 1, "the confirmation posted twice sent once"
    audited = [(what, tenant) for what, tenant, _, _ in _audited(caplog)]
    assert audited == [("labelled_cancel", "acme"), ("labelled_pause", "acme")]
    (line,) = [r for r in caplog.records if getattr(r, "what", None) == "labelled_cancel"]
    assert line.labels == {"campaign": "bf", "tier": "gold"}  # type: ignore[attr-defined]
    assert (line.count, line.state, line.user) == (1, None, "token")  # type: ignore[attr-defined]


async def test_a_state_filter_offers_only_the_action_that_acts_on_exactly_its_timers(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="worker.ops.console")
    async with running_replica(settings), jetstream(settings) as js:
        await _store(js, settings, db_url, [("acme", sid, {"campaign": "bf"}) for sid in "abc"])
        with console(settings) as (on, csrf):
            asked = on.post("/act/pause/acme/a", data={"csrf": csrf}).text
            assert on.post("/act/pause/acme/a", data=_posted(_Form(asked).fields)).status_code == 303
            await until(lambda: _states(db_url, "acme")["a"] == "Paused", what="a paused")
            scheduled = on.get("/tenants/acme?label=campaign%3Dbf&state=Scheduled").text
            assert "Pause all 2 matching…" in scheduled
            assert "Cancel all" not in scheduled and "Resume all" not in scheduled
            assert "a cancel by label takes the Paused timers" in scheduled
            paused = on.get("/tenants/acme?label=campaign%3Dbf&state=Paused").text
            assert "Resume all 1 matching…" in paused and "Cancel all" not in paused
            final = on.get("/tenants/acme?label=campaign%3Dbf&state=Reached").text
            assert "matching…" not in final and "Reached timers are final" in final
            # Posted directly, an action the filter does not allow is refused, and says why.
            direct = {"csrf": csrf, "label": "campaign=bf", "state": "Scheduled", "confirm": "yes"}
            refused = on.post("/act-labelled/cancel/acme", data=direct)
            assert refused.status_code == 409 and "a cancel by label takes the Paused timers" in refused.text
            bad = on.post("/act-labelled/cancel/acme", data={**direct, "state": "<b>Gone</b>"})
            assert bad.status_code == 400 and bad.text.startswith("bad state: one of Scheduled")
            ask = on.post(
                "/act-labelled/resume/acme", data={"csrf": csrf, "label": "campaign=bf", "state": "Paused"}
            )
            assert "Now 1 Paused timer of acme matches it." in ask.text
            done = on.post("/act-labelled/resume/acme", data=_posted(_Form(ask.text).fields))
            assert done.status_code == 303 and done.headers["location"] == (
                "/tenants/acme?label=campaign%3Dbf&state=Paused&done=labelled_resume"
            )
            await until(lambda: _states(db_url, "acme")["a"] == "Scheduled", what="the bulk resume")
    assert _states(db_url, "acme") == {"a": "Scheduled", "b": "Scheduled", "c": "Scheduled"}
    (line,) = [r for r in caplog.records if getattr(r, "what", None) == "labelled_resume"]
    assert (line.state, line.count) == ("Paused", 1)  # type: ignore[attr-defined]


async def test_a_hostile_label_filter_is_shown_inert_and_sent_as_typed_or_refused_in_one_line(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings), jetstream(settings) as js:
        await _store(
            js, settings, db_url, [("acme", "tagged", {"note": HOSTILE}), ("acme", "plain", {"note": "x"})]
        )
        with console(settings) as (on, csrf):
            page = on.get("/tenants/acme", params={"label": f"note={HOSTILE}"})
            assert page.status_code == 200 and HOSTILE not in page.text and "<b onmouseover" not in page.text
            assert "Cancel all 1 matching…" in page.text
            offered = re.findall(r"<form[^>]*act-labelled/cancel.*?</form>", page.text, re.S)
            asked = on.post("/act-labelled/cancel/acme", data=_posted(_Form(offered[0]).fields))
            assert asked.status_code == 200 and "<b onmouseover" not in asked.text
            done = on.post("/act-labelled/cancel/acme", data=_posted(_Form(asked.text).fields))
            assert done.status_code == 303
            await until(
                lambda: _states(db_url, "acme")["tagged"] == "Cancelled", what="the hostile one cancelled"
            )
            for value in ("x" * 300_000, "x\u0000y", "\x1b[31mred"):
                huge = on.post("/act-labelled/cancel/acme", data={"csrf": csrf, "label": f"note={value}"})
                assert (huge.status_code, huge.text) == (400, BAD_LABEL)
            not_utf8 = on.post(
                "/act-labelled/cancel/acme",
                content=f"csrf={csrf}&label=note%3D%ED%A0%80".encode(),
                headers={"content-type": "application/x-www-form-urlencoded"},
            )
            # Not UTF-8: read as replacement characters, a filter no timer carries.
            assert not_utf8.status_code == 200 and "Now 0 Scheduled or paused timers" in not_utf8.text
            many = [f"k{i}=v" for i in range(40)]
            assert on.post("/act-labelled/cancel/acme", data={"csrf": csrf, "label": many}).text == BAD_LABEL
            assert on.get("/tenants/acme", params={"label": "note=" + "x" * 5000}).status_code == 400
            assert (
                on.post("/act-labelled/cancel/a%20b", data={"csrf": csrf, "label": "note=x"}).status_code
                == 404
            )
    assert _states(db_url, "acme") == {"tagged": "Cancelled", "plain": "Scheduled"}
