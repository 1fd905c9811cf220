"""The console in a real headless browser (Debian's chromium, driven by playwright): log in, find a
timer, replay a fixed DLQ entry and see its timer. Screenshots go to tests/artifacts/console/."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import uvicorn
from playwright.async_api import Page, async_playwright, expect

from tests.helpers import iso_in, jetstream, publish_raw, row, running_replica, until
from tests.integration.test_console import TOKEN, console_settings
from worker.config import Settings
from worker.ops.console.app import create_app

ARTIFACTS = Path(__file__).parents[1] / "artifacts" / "console"
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
async def console(settings: Settings) -> AsyncIterator[str]:
    """The console on a free localhost port, in this event loop; its base URL."""
    config = uvicorn.Config(
        create_app(console_settings(settings, console_actions=True)),
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
