"""worker/ops/reads.py: where is my timer? `list`, `describe`, `status --tenant` and `cancel`'s report,
on a real database."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.helpers import query, running_replica, until
from tests.integration.ops.test_cli import run
from worker.config import Settings
from worker.ops import reads

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def _insert(
    db_url: str, tenant: str, n: int, *, state: str = "Scheduled", start: datetime = T0, prefix: str = "sc-"
) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "SELECT %s, %s || lpad(i::text, 4, '0'), %s, %s + i * interval '1 minute' "
        "FROM generate_series(0, %s - 1) AS i",
        tenant,
        prefix,
        state,
        start,
        n,
    )


def _all_pages(db_url: str, f: reads.TimerFilter, limit: int) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    after = None
    with reads.connect(db_url) as conn:
        while True:
            page = reads.list_timers(conn, f, after, limit)
            seen += [(r["tenant_id"], r["service_call_id"]) for r in page.rows]
            if page.next_cursor is None:
                return seen
            after = page.next_cursor


def test_paging_a_tenant_returns_each_timer_once_in_key_order(db_url: str) -> None:
    _insert(db_url, "acme", 23)
    _insert(db_url, "other", 5)
    seen = _all_pages(db_url, reads.TimerFilter(tenant_id="acme"), limit=5)
    assert seen == [("acme", f"sc-{i:04d}") for i in range(23)]


def test_paging_by_due_time_crosses_tenants_and_ties(db_url: str) -> None:
    _insert(db_url, "a", 7)
    _insert(db_url, "b", 7)  # same dueAts as a's: ties broken by the key
    seen = _all_pages(db_url, reads.TimerFilter(), limit=3)
    assert seen == [(t, f"sc-{i:04d}") for i in range(7) for t in ("a", "b")]


def test_filters_state_and_due_window(db_url: str) -> None:
    _insert(db_url, "acme", 10)
    query(db_url, "UPDATE timers SET state = 'Cancelled' WHERE service_call_id IN ('sc-0001', 'sc-0002')")
    window = reads.TimerFilter(
        tenant_id="acme",
        state="Scheduled",
        due_from=T0 + timedelta(minutes=1),
        due_to=T0 + timedelta(minutes=5),
    )
    assert [k for _, k in _all_pages(db_url, window, 50)] == ["sc-0003", "sc-0004"]
    with pytest.raises(ValueError, match="give a tenant"):
        reads.TimerFilter(state="Reached")


def test_overdue_lists_only_what_is_due_by_the_database_clock(db_url: str) -> None:
    _insert(db_url, "late", 3, start=datetime.now(UTC) - timedelta(hours=1))
    _insert(db_url, "late", 2, start=T0, prefix="future-")
    got = _all_pages(db_url, reads.TimerFilter(tenant_id="late", overdue=True), 2)
    assert [k for _, k in got] == ["sc-0000", "sc-0001", "sc-0002"]


@pytest.mark.parametrize(
    ("name", "params", "index"),
    [
        (
            "inspect_tenant_timers",
            {"after": "", "state": None, "due_from": None, "due_to": None, "terms": None},
            "timers_pkey",
        ),
        ("inspect_due_timers", {"after_tenant": "", "after_id": "", "due_to": None}, "timers_due"),
        ("inspect_tenant_counts", {}, "timers_pkey"),
    ],
)
def test_listing_queries_walk_an_index(db_url: str, name: str, params: dict[str, Any], index: str) -> None:
    """A page costs the rows it reads: with 20,000 rows the plan is an index range, never a scan."""
    for t in range(20):
        _insert(db_url, f"t{t}", 1000)
    query(db_url, "ANALYZE timers")
    from worker.adapters.postgres.queries import QUERIES

    args = {"tenant_id": "t7", "after_due": T0, "limit": 50} | params
    with reads.connect(db_url) as conn:
        plan = "\n".join(r[0] for r in conn.execute(b"EXPLAIN " + QUERIES[name].encode(), args))  # type: ignore[call-overload]
    assert index in plan and "Seq Scan" not in plan, plan


def test_describe_says_why_a_timer_has_not_fired(db_url: str) -> None:
    now = datetime.now(UTC)
    _insert(db_url, "acme", 1, start=now - timedelta(minutes=10))
    with reads.connect(db_url) as conn:
        view = reads.describe(conn, "acme", "sc-0000")
        assert view is not None and view["overdue"] and "unclaimed" in view["why"]
        query(
            db_url,
            "UPDATE timers SET attempts = 3, last_error = 'nats: timeout', lease_owner = NULL, "
            "lease_expires_at = now() + interval '5 s'",
        )
        view = reads.describe(conn, "acme", "sc-0000")
        assert (
            view is not None and "publishing failed (nats: timeout)" in view["why"] and view["attempts"] == 3
        )
        query(
            db_url, "UPDATE timers SET lease_owner = 'replica-7', lease_expires_at = now() + interval '5 s'"
        )
        view = reads.describe(conn, "acme", "sc-0000")
        assert (
            view is not None and view["leaseOwner"] == "replica-7" and "claimed by replica-7" in view["why"]
        )
        assert reads.describe(conn, "acme", "nope") is None


def test_cli_list_describe_and_tenant_status(db_url: str) -> None:
    _insert(db_url, "acme", 3, start=datetime.now(UTC) - timedelta(minutes=10))
    env = {"TIMER_DATABASE_URL": db_url}
    listed = run("list", "--tenant", "acme", "--limit", "2", "--json", **env)
    assert listed.returncode == 0, listed.stderr
    page = json.loads(listed.stdout)
    assert [t["serviceCallId"] for t in page["timers"]] == ["sc-0000", "sc-0001"] and page["next"]
    assert page["timers"][0]["dueAt"].endswith("Z") and "tenant_id" not in page["timers"][0]
    rest = json.loads(run("list", "--tenant", "acme", "--after", page["next"], "--json", **env).stdout)
    assert [t["serviceCallId"] for t in rest["timers"]] == ["sc-0002"] and rest["next"] is None

    described = run("describe", "--tenant", "acme", "--id", "sc-0001", **env)
    assert described.returncode == 0 and "overdue" in described.stdout and "why" in described.stdout
    missing = run("describe", "--tenant", "acme", "--id", "nope", **env)
    assert missing.returncode == 1 and "dlq list --tenant acme --id nope" in missing.stderr

    summary = json.loads(run("status", "--tenant", "acme", "--json", **env).stdout)
    assert summary["tenant"] == "acme" and summary["counts"]["Scheduled"] == 3 and summary["overdue"] == 3
    assert summary["nextDueAt"] is None and "oldestOverdueS" in summary
    bad = run("list", "--tenant", "acme", "--due-to", "tomorrow", **env)
    assert bad.returncode == 2 and "--due-to" in bad.stderr and len(bad.stderr.splitlines()) == 1


async def test_cancel_reports_what_it_did(settings: Settings, db_url: str) -> None:
    env = {"TIMER_DATABASE_URL": db_url, "TIMER_NATS_URL": settings.nats_url}
    env |= {f"TIMER_{k.upper()}": str(getattr(settings, k)) for k in ("subject_prefix", "command_stream")}
    _insert(db_url, "acme", 1)  # due in 2030
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at) "
        "VALUES ('acme', 'done', 'Reached', now())",
    )
    async with running_replica(settings):
        cancelled = await asyncio.to_thread(run, "cancel", "--tenant", "acme", "--id", "sc-0000", **env)
        assert (cancelled.returncode, cancelled.stdout.strip()) == (0, "cancelled acme/sc-0000"), (
            cancelled.stderr
        )
        fired = await asyncio.to_thread(run, "cancel", "--tenant", "acme", "--id", "done", **env)
        assert fired.returncode == 1 and fired.stderr.startswith("not cancelled: acme/done has fired")
        never = await asyncio.to_thread(run, "cancel", "--tenant", "acme", "--id", "never-existed", **env)
        assert (never.returncode, never.stderr.strip()) == (
            1,
            "no such timer: acme/never-existed; nothing to cancel",
        )
        again = await asyncio.to_thread(run, "cancel", "--tenant", "acme", "--id", "sc-0000", **env)
        assert again.returncode == 0 and again.stdout.startswith("already cancelled: acme/sc-0000")


def _env(settings: Settings) -> dict[str, str]:
    from tests.helpers import settings_env

    return settings_env(settings)


async def test_describe_tells_a_queued_command_from_a_rejected_one(settings: Settings) -> None:
    """With no replica running, a ScheduleTimer waits in the command stream: not rejected."""
    from worker.client import TimerClient

    async with running_replica(settings):
        pass  # creates the streams and the command consumer, then stops
    async with await TimerClient.connect(settings.nats_url, settings.subject_prefix) as client:
        await client.schedule("acme", "queued", datetime.now(UTC) + timedelta(hours=1))
    described = await asyncio.to_thread(
        run, "describe", "--tenant", "acme", "--id", "queued", **_env(settings)
    )
    assert described.returncode == 1 and "may have been rejected" not in described.stderr
    assert "1 command(s) wait in the command stream and no replica is taking them" in described.stderr
    status = await asyncio.to_thread(run, "status", **_env(settings))
    assert "commands   1 queued, 0 being applied; no replica is taking commands" in status.stdout, (
        status.stdout
    )

    async with running_replica(settings):

        async def taken() -> bool:
            shown = json.loads((await asyncio.to_thread(run, "status", "--json", **_env(settings))).stdout)
            return bool(shown["commands"]["pending"] == 0 and shown["commands"]["pullers"] >= 1)

        await until(taken, what="status showing a replica taking commands")
        gone = await asyncio.to_thread(
            run, "describe", "--tenant", "acme", "--id", "never-sent", **_env(settings)
        )
        assert "no command waits to be applied: if it was sent, it was rejected" in gone.stderr


def test_status_shows_a_back_off_as_such_in_camel_case(db_url: str) -> None:
    """A failed publish leaves a lease without an owner: a back-off, not a replica called None."""
    _insert(db_url, "acme", 1, start=datetime.now(UTC) - timedelta(minutes=1))
    query(
        db_url, "UPDATE timers SET attempts = 2, last_error = 'x', lease_expires_at = now() + interval '1 h'"
    )
    env = {"TIMER_DATABASE_URL": db_url, "TIMER_NATS_URL": "nats://127.0.0.1:1"}
    shown = run("status", **env)
    assert shown.returncode == 0, shown.stderr
    assert "None" not in shown.stdout and "leases     none held" in shown.stdout
    assert "1 more retried after failed publishes (back-off)" in shown.stdout, shown.stdout
    assert "commands   unknown, NATS did not answer (TIMER_NATS_URL)" in shown.stdout
    report = json.loads(run("status", "--json", **env).stdout)
    assert report["backingOff"] == 1 and "topTenants" in report and "top_tenants" not in report


def test_describe_prints_json_values_aligned_and_one_time_format(db_url: str) -> None:
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, repeat_every, repeat_times, "
        "command_ts, lease_expires_at) VALUES ('acme', 'rec', 'Scheduled', '2030-01-01T00:00:00Z', "
        "'PT1H', 3, 1795000000000, now() - interval '1 s')",
    )
    out = run("describe", "--tenant", "acme", "--id", "rec", TIMER_DATABASE_URL=db_url).stdout
    lines = dict(line.split(None, 1) for line in out.splitlines())
    assert json.loads(lines["repeat"]) == {
        "every": "PT1H",
        "cron": None,
        "times": 3,
        "until": None,
        "timezone": None,
    }
    assert lines["commandTimestampMs"] == "1795000000000"
    times = [v for k, v in lines.items() if k.endswith("At")]
    assert times and all(v.endswith("Z") and "+00:00" not in v for v in times), times


def test_output_into_a_closed_pipe_ends_quietly(db_url: str) -> None:
    """`timer-service list ... | head -1`: no `[Errno 32] Broken pipe`, no traceback."""
    import subprocess
    import sys

    _insert(db_url, "acme", 1000)
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("TIMER_")}
    shell = f"{sys.executable} -m worker list --tenant acme --limit 1000 | head -1"
    done = subprocess.run(
        ["sh", "-c", shell],
        env=env | {"TIMER_DATABASE_URL": db_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("TENANT") and done.stderr == "", done.stderr


def test_list_shows_a_windowed_timers_due_at_and_beside_it_when_it_is_planned(db_url: str) -> None:
    """With a firing window, the row's due_at is the planned instant (the claim orders by it):
    `list` shows dueAt as `get` does, the nominal one, and the planned instant beside it."""
    planned = T0 + timedelta(minutes=7)
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, nominal_due_at, fire_window) "
        "VALUES ('acme', 'spread', 'Scheduled', %s, %s, 'PT10M'), "
        "('acme', 'plain', 'Scheduled', %s, NULL, NULL)",
        planned,
        T0,
        T0,
    )
    with reads.connect(db_url) as conn:
        page = reads.list_timers(conn, reads.TimerFilter(tenant_id="acme"))
    lines = reads.render_page(page).splitlines()
    assert lines[1].split() == ["acme", "plain", "Scheduled", reads.fmt_time(T0)]
    assert lines[2].split() == [
        "acme",
        "spread",
        "Scheduled",
        reads.fmt_time(T0),
        "planned",
        reads.fmt_time(planned),
    ]
    plain, spread = (reads.row_json(r) for r in page.rows)
    assert (spread["dueAt"], spread["plannedAt"]) == (reads.fmt_time(T0), reads.fmt_time(planned))
    assert plain["dueAt"] == reads.fmt_time(T0) and "plannedAt" not in plain
    assert "nominalDueAt" not in spread
