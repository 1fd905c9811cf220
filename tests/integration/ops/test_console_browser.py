"""The console in a real headless browser (Debian's chromium, driven by playwright): log in, find a
timer, replay a fixed DLQ entry and see its timer. Screenshots go to tests/artifacts/console/."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import uvicorn
from playwright.async_api import Browser, Page, Playwright, async_playwright, expect

from tests.helpers import iso_in, jetstream, publish_raw, query, row, running_replica, until
from tests.integration.ops.test_console import TOKEN, console_settings
from worker.adapters.postgres.stats import StatsRollup
from worker.client import TimerClient
from worker.config import Settings
from worker.ops import dlq
from worker.ops.console.app import create_app

ARTIFACTS = Path(__file__).parents[2] / "artifacts" / "console"
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@contextlib.asynccontextmanager
async def console(settings: Settings, **extra: object) -> AsyncIterator[str]:
    """The console on a free localhost port, in this event loop; its base URL."""
    config = uvicorn.Config(
        create_app(console_settings(settings, console_actions=True, **extra)),
        host="127.0.0.1",
        port=0,
        log_config=None,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), what="console start")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=10)


async def shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def test_find_a_timer_and_replay_a_fixed_command_in_a_browser(settings: Settings, db_url: str) -> None:
    assert shutil.which("chromium"), "Debian's chromium is missing: `make system-packages` installs it"
    p = settings.subject_prefix
    async with running_replica(settings), console(settings) as base, jetstream(settings) as js:
        for tenant, n in (("acme", 5), ("globex", 3), ("initech", 2)):
            for i in range(n):
                body = {"tenantId": tenant, "serviceCallId": f"invoice-{i}", "dueAt": iso_in(3600 + i)}
                await publish_raw(js, settings, tenant, "schedule", body)
        broken = {"tenantId": "acme", "serviceCallId": "reminder-7", "dueAt": "2030-01-01 09:00"}
        await publish_raw(js, settings, "acme", "schedule", broken)
        await until(lambda: row(db_url, "initech", "invoice-1") is not None, what="timers stored")

        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = await browser.new_page(viewport={"width": 1200, "height": 800})

            await page.goto(base + "/")
            await expect(page).to_have_url(base + "/login")  # nothing without logging in
            await page.fill("input[name=token]", "wrong-token-000000")
            await page.get_by_role("button", name="Log in").click()
            await expect(page.get_by_role("alert")).to_contain_text("not recognised")
            await page.fill("input[name=token]", TOKEN)
            await page.get_by_role("button", name="Log in").click()
            await expect(page.locator("h1")).to_have_text("Overview")
            await expect(page.locator("body")).to_contain_text("acme")
            await shot(page, "1-overview")

            await page.fill("header input[name=tenant]", "acme")
            await page.fill("header input[name=id]", "invoice-2")
            await page.get_by_role("button", name="Find").click()
            await expect(page.locator("#why")).to_contain_text("waiting: due in")
            await expect(page.locator("body")).to_contain_text("Scheduled")
            await shot(page, "2-timer")

            # The producer says reminder-7 never fired: it is not stored, and its page shows why.
            await page.goto(f"{base}/timers/acme/reminder-7")
            await expect(page.locator("#why")).to_contain_text("No such timer")
            await expect(page.locator("body")).to_contain_text("bad_due_at")
            await page.click("table >> text=bad_due_at >> xpath=.. >> a")
            await expect(page.locator("h1")).to_contain_text("DLQ entry")
            await expect(page.locator("body")).to_contain_text(f"{p}.acme.timer.schedule")
            fixed = dict(broken, dueAt=iso_in(7200, db_url))
            await page.fill("textarea[name=body]", json.dumps(fixed))
            await shot(page, "3-dlq-entry")
            await page.get_by_role("button", name="Replay").click()
            await expect(page.get_by_role("status")).to_contain_text("removed from the DLQ")
            await until(lambda: row(db_url, "acme", "reminder-7") is not None, what="the replayed timer")
            await page.get_by_role("link", name="Open timer reminder-7").click()
            await expect(page.locator("#why")).to_contain_text("waiting: due in")
            await shot(page, "4-replayed-timer")

            await page.goto(base + "/dlq")
            await expect(page.locator("body")).to_contain_text("no entries")
            await page.get_by_role("button", name="Log out").click()
            await page.goto(base + "/dlq")
            await expect(page).to_have_url(base + "/login")
            await browser.close()


async def test_a_reader_behind_an_identity_proxy_sees_no_action_and_an_operator_does_in_a_browser(
    settings: Settings, db_url: str
) -> None:
    # The browser stands for oauth2-proxy's user: the proxy, on this host, adds X-Forwarded-User
    # to each request it passes on; the console believes it from 127.0.0.1 alone.
    assert shutil.which("chromium"), "Debian's chromium is missing: `make system-packages` installs it"
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "VALUES ('acme', 'invoice-1', 'Scheduled', now() + interval '1 hour')",
    )
    behind_proxy = {
        "console_user_header": "X-Forwarded-User",
        "console_trusted_proxies": "127.0.0.1",
        "console_operators": "bob",
    }
    async with console(settings, **behind_proxy) as base, async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for user, operator in (("alice", False), ("bob", True)):
            context = await browser.new_context(
                viewport={"width": 1200, "height": 800}, extra_http_headers={"X-Forwarded-User": user}
            )
            page = await context.new_page()
            await page.goto(f"{base}/timers/acme/invoice-1")  # no login form: the proxy named her
            await expect(page.locator("#why")).to_contain_text("waiting: due in")
            role = "operator" if operator else "read-only"
            await expect(page.locator("#whoami")).to_have_text(f"{user} · {role}")
            await expect(page.get_by_role("button", name="Cancel…")).to_have_count(1 if operator else 0)
            await expect(page.get_by_role("button", name="Pause…")).to_have_count(1 if operator else 0)
            await expect(page.locator("#read-only")).to_have_count(0 if operator else 1)
            await expect(page.get_by_role("button", name="Log out")).to_have_count(0)
            await page.goto(f"{base}/tenants/acme")
            await expect(page.get_by_role("button", name="Pause tenant…")).to_have_count(1 if operator else 0)
            await shot(page, f"roles-{role}")
            await context.close()
        await browser.close()


async def _click(page: Page, name: str) -> None:
    await page.get_by_role("button", name=name).click()


async def _logged_in(pw: Playwright, base: str) -> tuple[Browser, Page]:
    """A browser, and its page logged in with the token (on the overview)."""
    browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    await page.goto(base + "/login")
    await page.fill("input[name=token]", TOKEN)
    await _click(page, "Log in")
    return browser, page


async def test_live_updates_charts_search_history_and_every_action_in_a_browser(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22: the console as an operator uses it. The overview's charts (from the replica's own
    minute stats), a tenant's page updating in place as a timer arrives, a search by correlationId
    across tenants landing on a timer whose firing shows in its history, then each action (pause and
    resume of a timer and of a tenant too, issue 23), each confirmed first and each audited with
    who did it."""
    caplog.set_level(logging.INFO, logger="worker.ops.console")
    async with running_replica(settings) as replica, console(settings) as base, jetstream(settings) as js:
        rollup = StatsRollup(replica.pool, replica.s.worker_id)
        client = TimerClient(js._nc, settings.subject_prefix)
        await client.schedule(
            "globex", "order-1", datetime.now(UTC) + timedelta(seconds=1), correlation_id="corr-42"
        )
        for sid in ("act-cancel", "act-fire", "act-move"):
            await client.schedule("acme", sid, datetime.now(UTC) + timedelta(hours=1))
        for sid in ("bad-1", "bad-2"):
            body = {"tenantId": "acme", "serviceCallId": sid, "dueAt": "2030-01-01 09:00"}
            await publish_raw(js, settings, "acme", "schedule", body)
        await until(
            lambda: (row(db_url, "globex", "order-1") or {}).get("state") == "Reached", what="order-1 fired"
        )
        await until(lambda: row(db_url, "acme", "act-move") is not None, what="timers stored")
        await rollup.write()  # what the replica does every 15 s

        async with async_playwright() as pw:
            browser, page = await _logged_in(pw, base)

            # The overview's charts and the replica, alive.
            await expect(page.locator("#chart-fires figcaption")).to_contain_text("fires/s")
            await expect(page.locator("#chart-lateness svg")).to_be_visible()
            await expect(page.locator("#replicas")).to_contain_text(replica.s.worker_id)
            await expect(page.locator("#replicas")).to_contain_text("alive")
            await shot(page, "5-overview-charts")

            # Live: a timer scheduled while the tenant's page is open shows up without a reload.
            await page.goto(base + "/tenants/acme")
            await page.evaluate("window.notReloaded = true")
            await expect(page.locator("#timers")).not_to_contain_text("arrived-later")
            await client.schedule("acme", "arrived-later", datetime.now(UTC) + timedelta(hours=2))
            await expect(page.locator("#timers")).to_contain_text("arrived-later", timeout=20_000)
            assert await page.evaluate("window.notReloaded") is True
            await expect(page.locator("#updated")).to_contain_text("updated")
            await shot(page, "6-tenant-live")

            # Search by correlationId, no tenant given: its one timer, and its firing in the history.
            await page.fill("header input[name=id]", "corr-42")
            await _click(page, "Find")
            await expect(page.locator("h1")).to_contain_text("order-1")
            await expect(page.locator("#history")).to_contain_text("2")  # an event sequence
            assert await page.locator("#history tr").count() == 2  # its one firing under the heading
            await expect(page.locator("#history time").first).to_have_attribute("title", re.compile(r"Z$"))
            await shot(page, "7-timer-history")

            # Fire now: confirmed, then the page follows it to fired.
            await page.goto(f"{base}/timers/acme/act-fire")
            await _click(page, "Fire now…")
            await expect(page.locator("h1")).to_contain_text("Fire now")
            await shot(page, "8-confirm-fire")
            await _click(page, "Yes, fire now")
            await expect(page.get_by_role("status")).to_contain_text("fire now")
            await expect(page.locator("#why")).to_contain_text("fired", timeout=20_000)

            # Reschedule, then cancel.
            await page.goto(f"{base}/timers/acme/act-move")
            await page.fill("input[name=dueAt]", "2031-02-03T04:05:06Z")
            await _click(page, "Reschedule…")
            await _click(page, "Yes, reschedule")
            await expect(page.locator("#fields")).to_contain_text("2031", timeout=20_000)
            await page.goto(f"{base}/timers/acme/act-cancel")
            await _click(page, "Cancel…")
            await _click(page, "Yes, cancel")
            await expect(page.locator("#why")).to_contain_text("cancelled", timeout=20_000)
            await shot(page, "9-cancelled")

            # Pause one timer, then resume it (the buttons follow its state on the next load).
            await page.goto(f"{base}/timers/acme/act-move")
            await _click(page, "Pause…")
            await _click(page, "Yes, pause")
            await expect(page.locator("#why")).to_contain_text("paused by itself", timeout=20_000)
            await page.reload()
            await _click(page, "Resume…")
            await _click(page, "Yes, resume")
            await expect(page.locator("#why")).not_to_contain_text("paused", timeout=20_000)
            # Pause the whole tenant: its page shows it paused, in place; then resume it.
            await page.goto(f"{base}/tenants/acme")
            await _click(page, "Pause tenant…")
            await expect(page.locator("h1")).to_contain_text("Pause tenant acme")
            await _click(page, "Yes, pause")
            await expect(page.locator("#tenant-paused")).to_contain_text("Paused since", timeout=20_000)
            # The flag commits first, then the tenant's rows move (in chunks): both show, in place.
            await expect(page.locator("#timers")).to_contain_text("Paused", timeout=20_000)
            await shot(page, "9b-tenant-paused")
            await _click(page, "Resume tenant…")
            await _click(page, "Yes, resume")
            await expect(page.locator("#tenant-paused")).to_contain_text("Not paused", timeout=20_000)

            # The DLQ: replay every bad_due_at entry (both refused: they would come back), then purge.
            await page.goto(base + "/dlq?tenant=acme&reason=bad_due_at")
            await _click(page, "Replay all…")
            await expect(page.locator("h1")).to_contain_text("Replay 2 DLQ entries")
            await _click(page, "Yes, replay 2")
            await expect(page.get_by_role("status")).to_contain_text("0 DLQ entries replayed")
            await expect(page.locator("body")).to_contain_text("would be rejected again")
            await page.goto(base + "/dlq?tenant=acme&reason=bad_due_at")
            await _click(page, "Purge all…")
            await _click(page, "Yes, purge 2")
            await expect(page.get_by_role("status")).to_contain_text("2 DLQ entries deleted")
            await page.goto(base + "/dlq?tenant=acme")
            await expect(page.locator("#entries")).to_contain_text("no entries")
            await shot(page, "10-dlq-purged")
            await browser.close()

    audited = [
        (r.what, r.tenant, r.id, r.user)  # type: ignore[attr-defined]
        for r in caplog.records
        if getattr(r, "action", None) == "console_action"
    ]
    assert audited == [
        ("fire", "acme", "act-fire", "token"),
        ("reschedule", "acme", "act-move", "token"),
        ("cancel", "acme", "act-cancel", "token"),
        ("pause", "acme", "act-move", "token"),
        ("resume", "acme", "act-move", "token"),
        ("tenant_pause", "acme", None, "token"),
        ("tenant_resume", "acme", None, "token"),
        ("dlq_replay_bulk", "acme", None, "token"),
        ("dlq_purge", "acme", None, "token"),
    ]


async def test_a_bulk_action_on_a_label_filter_and_a_chart_range_in_a_browser(
    settings: Settings, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The tenant's page filtered by a label offers to cancel all its matching timers: the
    confirmation shows the count and the filter, the cancel applies, and the same confirmation
    posted again from the page sends nothing. The overview's charts switch to a longer range."""
    caplog.set_level(logging.INFO, logger="worker.ops.console")
    # Minute stats of three hours ago, and none since: the last hour is empty, six hours are not.
    # Three whole bins of the 6h range (4 minutes, console_stats's origin), 2 fired a second each.
    query(
        db_url,
        "INSERT INTO timer_stats (minute, worker_id, fired, rejected, overdue, lateness_le, lateness) "
        "SELECT date_bin('4 minutes', now() - interval '3 hours', '2000-01-01 00:00Z') "
        "       - i * interval '1 minute', 'replica-gone', 120, 0, 0, '{0.01}', '{1}' "
        "FROM generate_series(1, 12) AS i",
    )
    async with console(settings) as base, async_playwright() as pw:
        browser, page = await _logged_in(pw, base)

        # No replica yet: the minutes of three hours ago are the only ones.
        await expect(page.locator("#chart-fires figcaption")).to_contain_text("no data yet")
        await page.get_by_role("link", name="6h").click()
        await expect(page).to_have_url(base + "/?range=6h")
        await expect(page.locator("#chart-fires figcaption")).to_contain_text("fires/s 2")
        await expect(page.locator("#chart-note")).to_contain_text("a point per 4 minutes")
        # The live region fetched again keeps the range.
        await expect(page.locator("#updated")).to_contain_text("updated", timeout=20_000)
        await expect(page.locator("#chart-fires figcaption")).to_contain_text("fires/s 2")
        await shot(page, "11-overview-6h")

        async with running_replica(settings), jetstream(settings) as js:
            client = TimerClient(js._nc, settings.subject_prefix)
            later = datetime.now(UTC) + timedelta(hours=1)
            for sid, campaign in (("bf-1", "bf"), ("bf-2", "bf"), ("bf-3", "bf"), ("xmas-1", "xmas")):
                await client.schedule("acme", sid, later, labels={"campaign": campaign})
            await until(lambda: row(db_url, "acme", "xmas-1") is not None, what="timers stored")

            await page.goto(base + "/tenants/acme")
            await page.fill("input[name=label]", "campaign=bf")
            await _click(page, "Show")
            await expect(page.locator("#timers")).not_to_contain_text("xmas-1")
            await _click(page, "Cancel all 3 matching…")
            await expect(page.locator("h1")).to_have_text("Cancel all 3 matching timers of acme")
            await expect(page.locator("#why")).to_contain_text("campaign=bf")
            await shot(page, "12-confirm-bulk-cancel")
            posted = await page.evaluate(
                "() => new URLSearchParams(new FormData([...document.forms].pop())).toString()"
            )
            await _click(page, "Yes, cancel them")
            await expect(page.get_by_role("status")).to_contain_text(
                "CancelTimer sent for the timers labelled"
            )
            for sid in ("bf-1", "bf-2", "bf-3"):
                await until(
                    lambda sid=sid: (row(db_url, "acme", sid) or {}).get("state") == "Cancelled", what=sid
                )
            again = await page.evaluate(
                """async (body) => (await fetch("/act-labelled/cancel/acme", {method: "POST", body,
                   headers: {"Content-Type": "application/x-www-form-urlencoded"}})).status""",
                posted,
            )
            assert again == 409
            await expect(page.locator("#timers")).to_contain_text("Cancelled", timeout=20_000)
            await shot(page, "13-bulk-cancelled")
            await browser.close()
    assert (row(db_url, "acme", "xmas-1") or {}).get("state") == "Scheduled"
    sent = [r for r in caplog.records if getattr(r, "what", None) == "labelled_cancel"]
    assert [(r.labels, r.count) for r in sent] == [({"campaign": "bf"}, 3)]  # type: ignore[attr-defined]


async def test_every_tenant_and_the_dlq_filter_in_a_browser(settings: Settings, db_url: str) -> None:
    """From the overview to every tenant (page after page, a prefix, by pending timers), and the DLQ
    filtered by serviceCallId, with a bad time and a hostile prefix refused in a line on the page."""
    assert shutil.which("chromium"), "Debian's chromium is missing: `make system-packages` installs it"
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "SELECT 'tenant-' || lpad(t::text, 2, '0'), 'sc-' || i, 'Scheduled', now() + interval '1 hour' "
        "FROM generate_series(1, 60) AS t, generate_series(1, t %% 7 + 1) AS i",
    )
    async with running_replica(settings), console(settings) as base, jetstream(settings) as js:
        for sid in ("twice", "once", "twice"):
            body = {"tenantId": "acme", "serviceCallId": sid, "dueAt": "2030-01-01 09:00"}
            await publish_raw(js, settings, "acme", "schedule", body)
        async with dlq.open_dlq(settings) as q:

            async def stored() -> bool:
                return len((await q.page(dlq.DlqFilter())).entries) == 3

            await until(stored, what="three DLQ entries")
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = await browser.new_page(viewport={"width": 1200, "height": 800})
            dialogs: list[str] = []
            page.on("dialog", lambda d: dialogs.append(d.message))
            await page.goto(base + "/login")
            await page.fill("input[name=token]", TOKEN)
            await page.get_by_role("button", name="Log in").click()
            await page.locator("#all-tenants").click()
            await expect(page.locator("h1")).to_contain_text("Tenants")
            rows = page.locator("#tenants a")
            await expect(rows).to_have_count(50)
            await expect(rows.first).to_have_text("tenant-01")
            await page.get_by_role("link", name="Next page").click()
            await expect(rows).to_have_count(10)
            await expect(rows.last).to_have_text("tenant-60")
            await page.get_by_label("tenant prefix").fill("tenant-1")
            await page.get_by_label("sort").select_option("pending")
            await page.get_by_role("button", name="Show").click()
            # tenant-13 holds 13 % 7 + 1 = 7 timers, the most of tenant-10 ... tenant-19
            await expect(rows).to_have_count(10)
            await expect(rows.first).to_have_text("tenant-13")
            await shot(page, "tenants")
            await page.get_by_label("tenant prefix").fill('"><img src=x onerror=alert(1)>')
            await page.get_by_role("button", name="Show").click()
            await expect(page.get_by_role("alert")).to_contain_text(
                "a tenant prefix is the start of a tenant id"
            )
            await expect(page.get_by_role("alert")).to_contain_text("<img src=x onerror=alert(1)>")
            await expect(page.locator("main img")).to_have_count(0)

            await page.goto(base + "/dlq")
            await expect(page.locator("#entries tr")).to_have_count(4)  # the header and three entries
            await page.get_by_label("serviceCallId", exact=True).fill("twice")
            await page.get_by_role("button", name="Filter").click()
            await expect(page.locator("#entries tr")).to_have_count(3)
            await expect(page.locator("#entries")).not_to_contain_text("once")
            await shot(page, "dlq-filtered")
            await page.get_by_label("stored from").fill("last tuesday")
            await page.get_by_role("button", name="Filter").click()
            await expect(page.get_by_role("alert")).to_contain_text("from: not a time: 'last tuesday'")
            await expect(page.get_by_label("serviceCallId", exact=True)).to_have_value("twice")  # kept to fix
            assert dialogs == []
            await browser.close()
