"""Pause and resume under concurrency (worker/adapters/postgres/pausing.py, its locks): a schedule
in flight beside a tenant's pause or resume, a claimed recurring timer, a tenant's pause/resume
flood beside other tenants' commands, and a pause behind a stuck claim."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from tests.helpers import (
    consumer_idle,
    iso_in,
    jetstream,
    publish_raw,
    query,
    recorder,
    row,
    running_replica,
    until,
)
from worker.adapters.postgres import db, pausing
from worker.adapters.postgres.columns import schedule_columns
from worker.adapters.postgres.pausing import TENANT_LOCKS, intake_lock_keys, pause_lock_keys
from worker.adapters.postgres.queries import QUERIES
from worker.adapters.postgres.store import ORDER_GRACE, Store
from worker.config import Settings
from worker.contract import PauseTimers, ScheduleTimer
from worker.core.domain import Key


def _upsert_params(tenant: str, sid: str, due: datetime) -> dict[str, Any]:
    """The parameters Store._apply_round gives upsert_schedules for one ScheduleTimer."""
    command = ScheduleTimer(tenant, sid, due, None, None, None)
    return schedule_columns([command], None) | {
        "order_grace": ORDER_GRACE,
        "command_seq": None,
        "command_stored_at": None,
    }


async def _acknowledged_or_waiting(settings: Settings, db_url: str, tenant: str, paused: bool) -> bool:
    """The pause or resume was applied and acknowledged, or it waits for the stalled intake (a lock
    request not granted): only then is the stalled transaction let go, so the race is the one a
    replica meets, whichever way the command handles it."""
    if query(db_url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted") != [(0,)]:
        return True
    flag = _tenant_flag(db_url, tenant)
    return (flag not in (None, "absent")) == paused and await consumer_idle(settings)


async def _canary_fired(settings: Settings, db_url: str, js: Any, rec: Any, after: datetime) -> None:
    """Once the database clock is past `after`, a timer of another tenant due then is scheduled
    and waited for: the claim that took it took everything due before it (oldest first), and its
    event comes after theirs in the stream, so what has not reached the recorder by then did not
    fire. The signal a negative check waits on, instead of a sleep."""
    await until(lambda: query(db_url, "SELECT now() > %s", after) == [(True,)], what="the clock past it")
    key = f"canary-{after.timestamp()}"
    await publish_raw(
        js,
        settings,
        "canary",
        "schedule",
        {"tenantId": "canary", "serviceCallId": key, "dueAt": iso_in(0, db_url)},
    )
    await until(lambda: rec.keys()[("canary", key)] == 1, timeout=30, what="the canary fired")


def _tenant_flag(db_url: str, tenant: str) -> Any:
    rows = query(db_url, "SELECT paused_at FROM paused_tenants WHERE tenant_id = %s", tenant)
    return rows[0][0] if rows else "absent"


@contextlib.contextmanager
def _schedule_in_stalled_intake(
    db_url: str, tenant: str, sid: str, due: datetime, others: int = 0
) -> Iterator[None]:
    """An intake transaction that ran its statements (exactly the replica's: its tenants' shared
    lock, then upsert_schedules, with Store.apply's parameters) and then stalled before COMMIT: a
    replica stopped by a GC pause, CPU starvation, or a slow link to Postgres between the statement
    and its commit. It commits when the block ends, however it ends. With `others`, its batch held
    that many other tenants' commands too (their locks: past TENANT_LOCKS tenants, their slots')."""
    conn = psycopg.connect(db_url)
    tenants = [tenant, *(f"other-{i}" for i in range(others))]
    try:
        conn.execute(QUERIES["lock_tenants_shared"], {"keys": intake_lock_keys(tenants)}).fetchall()
        conn.execute(QUERIES["upsert_schedules"], _upsert_params(tenant, sid, due)).fetchall()
        yield
    finally:
        conn.commit()
        conn.close()


# The stalled batch alone, or with enough other tenants that it locks their slots instead of each.
BATCHES = pytest.mark.parametrize("others", [0, TENANT_LOCKS + 8], ids=["one-tenant", "many-tenants"])


# Issue 23 review, defect 1: a resume acknowledged while a ScheduleTimer of the tenant was in flight
# leaves the new timer Paused for ever under a resumed tenant: it never fires (a lost timer). The upsert's
# statement read paused_tenants before the resume's flag committed, so it stores the row Paused; its
# insert is invisible to resume_tenant_rows and tenant_left_paused until it commits, and the resume's
# one deferral (lease_ms) is the only wait. Nothing ever looks at the row again.
@BATCHES
async def test_a_resume_racing_an_in_flight_schedule_frees_the_new_timer_too(
    settings: Settings, db_url: str, others: int
) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme"})
        await until(lambda: _tenant_flag(db_url, "acme") not in (None, "absent"), what="tenant paused")
        await until(lambda: consumer_idle(settings), timeout=30, what="pause acknowledged")
        (now,) = query(db_url, "SELECT now()")[0]
        with _schedule_in_stalled_intake(db_url, "acme", "late", now - timedelta(seconds=1), others):
            await publish_raw(js, settings, "acme", "resume", {"tenantId": "acme"})
            await until(
                lambda: _acknowledged_or_waiting(settings, db_url, "acme", False),
                timeout=30,
                what="resume under way",
            )
        await until(lambda: _tenant_flag(db_url, "acme") is None, what="tenant resumed")
        await until(lambda: consumer_idle(settings), timeout=30, what="resume acknowledged")
        # Due 1 s before: it fires once the tenant is resumed. Left Paused (the defect), it never does.
        await until(lambda: rec.keys()[("acme", "late")] == 1, timeout=30, what="the resumed timer fired")
        # Its batch commits the firing after the PubAck, so the event may be in before the row is.
        await until(lambda: (row(db_url, "acme", "late") or {}).get("state") == "Reached", what="recorded")


# Issue 23 review, defect 1b: a pause acknowledged while a ScheduleTimer of the tenant was in
# flight leaves the new timer Scheduled under a paused tenant: it fires while the tenant is paused,
# though the pause was acknowledged as "none left unpaused".
@BATCHES
async def test_a_pause_racing_an_in_flight_schedule_pauses_the_new_timer_too(
    settings: Settings, db_url: str, others: int
) -> None:
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        await publish_raw(
            js, settings, "acme", "schedule",
            {"tenantId": "acme", "serviceCallId": "first", "dueAt": iso_in(3600, db_url)},
        )  # fmt: skip
        await until(lambda: row(db_url, "acme", "first") is not None)
        (now,) = query(db_url, "SELECT now()")[0]
        with _schedule_in_stalled_intake(db_url, "acme", "sneak", now + timedelta(seconds=2), others):
            await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme"})
            await until(
                lambda: _acknowledged_or_waiting(settings, db_url, "acme", True),
                timeout=30,
                what="pause under way",
            )
        await until(lambda: _tenant_flag(db_url, "acme") not in (None, "absent"), what="tenant paused")
        await until(lambda: consumer_idle(settings), timeout=30, what="pause acknowledged")
        await _canary_fired(settings, db_url, js, rec, after=now + timedelta(seconds=2))
        assert _tenant_flag(db_url, "acme") not in (None, "absent")  # still paused
        assert rec.keys()[("acme", "sneak")] == 0, "fired while its tenant was paused"
        assert (row(db_url, "acme", "sneak") or {}).get("state") == "Paused"


# Issue 23 review, defect 2: a recurring timer claimed when its tenant is paused keeps firing after its
# claimed occurrence: record_fired moves it to its next occurrence as Scheduled (it ignores the paused
# flag), and the pause only comes back for it a whole lease (TIMER_LEASE_MS, default 3 s) later, so a
# 1 s timer fires two or three more times, and again whenever the redelivery meets it claimed.
# README: "A claimed occurrence fires ... the timer is paused right after it".
async def test_a_claimed_recurring_timer_fires_at_most_once_after_its_tenant_is_paused(
    settings: Settings, db_url: str
) -> None:
    n = 40
    async with running_replica(settings), recorder(settings) as rec, jetstream(settings) as js:
        for i in range(n):
            await publish_raw(
                js, settings, "acme", "schedule",
                {"tenantId": "acme", "serviceCallId": f"tick-{i:02d}",
                 "dueAt": iso_in(2 + i / n, db_url), "repeat": {"every": "PT1S"}},
            )  # fmt: skip
        await until(
            lambda: all(rec.keys()[("acme", f"tick-{i:02d}")] >= 2 for i in range(n)),
            timeout=30,
            what="every timer ticking",
        )
        await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme"})
        await until(lambda: _tenant_flag(db_url, "acme") not in (None, "absent"), what="tenant paused")
        (paused_at,) = query(db_url, "SELECT paused_at FROM paused_tenants WHERE tenant_id = 'acme'")[0]
        await until(
            lambda: (
                query(db_url, "SELECT count(*) FROM timers WHERE tenant_id='acme' AND state='Scheduled'")
                == [(0,)]
            ),
            timeout=60,
            what="every timer paused",
        )
        # Every occurrence fired before its timer was paused was published before its record: the
        # canary, published after, reaches the recorder after all of them.
        (now,) = query(db_url, "SELECT now()")[0]
        await _canary_fired(settings, db_url, js, rec, after=now)
        after = query(
            db_url,
            "SELECT service_call_id, fired_count FROM timers WHERE tenant_id = 'acme'",
        )
        # Fired occurrences recorded after the flag committed, per timer, from the events' dueAt.
        late: dict[str, int] = {}
        for f in rec.firings:
            if f.tenant_id == "acme" and f.due_at > paused_at.timestamp() + 0.2:
                late[f.service_call_id] = late.get(f.service_call_id, 0) + 1
    twice = {k: v for k, v in late.items() if v > 1}
    assert twice == {}, f"fired more than once after the pause: {twice} (of {len(after)})"


# Issue 23 review, defect 3: a tenant allowed only its own subjects can stall every
# other tenant's commands with a few small pause/resume messages. Intake applies each pause or resume
# alone and in stream order (Intake.apply), each one rewrites every row of the tenant (chunks of
# PAUSE_CHUNK) and is applied twice (a tenant's first application always defers, then is redelivered
# and walks the tenant again): one ~20-byte message costs O(tenant size) row writes on the shared
# intake path, with no per-tenant limit. Another tenant's ScheduleTimer queued behind them waits.
async def test_a_tenants_pause_resume_flood_does_not_hold_back_other_tenants_commands(
    settings: Settings, db_url: str
) -> None:
    big = 20000
    async with running_replica(settings):
        pass  # streams made
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at)"
        " SELECT 'noisy', 'sc-' || lpad(g::text, 7, '0'), 'Scheduled', now() + interval '1 day',"
        " now() + interval '1 day' FROM generate_series(1, %s) g",
        big,
    )
    async with recorder(settings) as rec, jetstream(settings) as js, running_replica(settings):
        for i in range(20):
            await publish_raw(js, settings, "noisy", "resume" if i % 2 else "pause", {"tenantId": "noisy"})
        started = asyncio.get_running_loop().time()
        await publish_raw(
            js, settings, "victim", "schedule",
            {"tenantId": "victim", "serviceCallId": "v", "dueAt": iso_in(0, db_url)},
        )  # fmt: skip
        await until(lambda: rec.keys()[("victim", "v")] == 1, timeout=300, what="the victim's timer fired")
        waited = asyncio.get_running_loop().time() - started
    # Without the flood this fires within a poll interval or so.
    assert waited < 5, f"another tenant's due timer waited {waited:.1f} s behind 20 pause/resume messages"


# Issue 23 review, defect 4: a pause meeting a stuck claim was never given up. A CancelTimer or ScheduleTimer
# waiting behind a claim first claimed longer than TIMER_STUCK_AFTER ago goes to the DLQ as
# timer_stuck (README, guarantees); a PauseTimers has no such rule (pausing.py returns "deferred" while
# tenant_left_scheduled counts the claimed row), so it is offered again every TIMER_LEASE_MS for ever,
# walking the whole tenant each time, and holds the command stream's ack floor (no purge past it).
async def test_a_pause_behind_a_stuck_claim_is_given_up_once_the_rest_is_paused(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings, stuck_after=timedelta(seconds=5)), jetstream(settings) as js:
        await publish_raw(
            js, settings, "acme", "schedule",
            {"tenantId": "acme", "serviceCallId": "stuck", "dueAt": iso_in(3600, db_url)},
        )  # fmt: skip
        await until(lambda: row(db_url, "acme", "stuck") is not None)
        # As a row no replica can publish leaves it: claimed long ago, its lease renewed by back-off.
        query(
            db_url,
            "UPDATE timers SET lease_expires_at = now() + interval '1 hour', claimed_at = now() - interval"
            " '2 hours', due_at = now() - interval '2 hours', last_error = 'publish failed'"
            " WHERE tenant_id = 'acme'",
        )
        # The control: a cancel behind it is given up (timer_stuck), and the consumer goes idle.
        await publish_raw(js, settings, "acme", "cancel", {"tenantId": "acme", "serviceCallId": "stuck"})
        await until(lambda: consumer_idle(settings), timeout=30, what="the cancel given up")
        await publish_raw(
            js, settings, "acme", "schedule",
            {"tenantId": "acme", "serviceCallId": "free", "dueAt": iso_in(3600, db_url)},
        )  # fmt: skip
        await until(lambda: row(db_url, "acme", "free") is not None)
        await publish_raw(js, settings, "acme", "pause", {"tenantId": "acme"})
        await until(lambda: _tenant_flag(db_url, "acme") not in (None, "absent"), what="tenant paused")
        await until(lambda: consumer_idle(settings), timeout=30, what="the pause acknowledged or given up")
        dlq = await js.pull_subscribe(f"{settings.subject_prefix}.acme.timer.dlq", stream=settings.dlq_stream)
        cancel, pause = await dlq.fetch(2, timeout=10)
    # Given up visibly, as the cancel was, once every other row is paused; the stuck row is left as is
    # (its record, if it ever comes, stores it Paused: record_fired).
    assert pause.headers is not None and pause.headers["Timer-Error"] == "timer_stuck"
    assert json.loads(pause.data) == {"tenantId": "acme"}
    assert cancel.headers is not None and cancel.headers["Timer-Error"] == "timer_stuck"
    assert (row(db_url, "acme", "free") or {}).get("state") == "Paused"
    assert (row(db_url, "acme", "stuck") or {}).get("state") == "Scheduled"


# Issue 36: intake held one shared advisory lock per tenant of its batch, 1,000 to 2,000 at once at
# a thousand tenants, from a lock table of max_locks_per_transaction x connections (6,400 entries on
# a default server): larger batches or more replicas ran it out ("out of shared memory").
async def test_an_intake_batch_of_as_many_tenants_as_it_may_hold_takes_a_bounded_number_of_locks(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    largest = next(m.le for m in Settings.model_fields["intake_batch_size"].metadata if hasattr(m, "le"))
    held: list[int] = []
    share: list[int] = []  # the lock table's entries per connection: what each may hold at once
    lock_keys = Store._lock_keys

    async def counted(self: Store, conn: psycopg.AsyncConnection[Any], keys: set[Key]) -> dict[Key, bool]:
        # Intake's next step after lock_tenants_shared, in its transaction: every tenant lock is held.
        cur = await conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        )
        held.append(int((await cur.fetchall())[0][0]))
        cur = await conn.execute("SELECT current_setting('max_locks_per_transaction')::int")
        share.append(int((await cur.fetchall())[0][0]))
        return await lock_keys(self, conn, keys)

    monkeypatch.setattr(Store, "_lock_keys", counted)
    due = datetime.now(UTC) + timedelta(days=1)
    commands = [ScheduleTimer(f"tenant-{i}", f"k-{i}", due, None, None, None) for i in range(largest)]
    async with db.pool(db_url, "locks", min_size=1, max_size=1, idle_in_transaction_ms=60_000) as pool:
        applied = await Store(pool).apply(commands)
    assert applied.outcomes == ["applied"] * largest
    assert len(held) == 1 and 0 < held[0] <= min(TENANT_LOCKS, share[0] // 2), (
        f"{held} advisory locks for {largest} tenants, of {share} per connection"
    )


async def test_a_small_intake_batch_holds_back_no_pause_of_another_tenant_of_its_slot(db_url: str) -> None:
    """A batch of few tenants locks each tenant's own key: a pause of another tenant hashed to the same
    slot does not wait for it (only a batch of more than TENANT_LOCKS tenants holds whole slots)."""
    acme = set(pause_lock_keys("acme"))
    other = next(t for t in (f"b-{i}" for i in range(10_000)) if acme & set(pause_lock_keys(t)))
    with _schedule_in_stalled_intake(db_url, "acme", "k", datetime.now(UTC) + timedelta(days=1)):
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            await conn.execute("SET lock_timeout = '5s'")  # waiting for the stalled batch fails it
            applied = await pausing.pause(conn, PauseTimers(other, None, False), None, timedelta(hours=1))
    assert applied.outcomes == ["applied"]
    assert _tenant_flag(db_url, other) not in (None, "absent")
