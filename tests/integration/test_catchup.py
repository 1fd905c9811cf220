"""repeat.catchup end to end (docs/USING.md, Recurring timers), on real Postgres and NATS: every replica
stopped while occurrences come due, then one started; "one" fires the awaited occurrence once,
"none" skips every missed one, "all" fires each, oldest first, and at most CATCHUP_MAX in a row."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from tests.helpers import (
    QUICK_DOWNTIME,
    epoch,
    iso_in,
    jetstream,
    publish_raw,
    query,
    recorder,
    row,
    running_replica,
    until,
)
from tests.twins import claim_params
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.core.domain import CATCHUP_MAX


async def test_after_downtime_one_fires_the_awaited_none_skips_and_all_fires_each(
    settings: Settings, db_url: str
) -> None:
    first = iso_in(3, db_url)  # time for the first replica to stop before it
    policies = ("one", "none", "all")
    async with contextlib.AsyncExitStack() as outer:
        async with running_replica(settings), jetstream(settings) as js:  # creates the streams
            rec = await outer.enter_async_context(recorder(settings))  # outlives this replica
            for policy in policies:
                body = {
                    "tenantId": "acme",
                    "serviceCallId": policy,
                    "dueAt": first,
                    "repeat": {"every": "PT1S", "catchup": policy},
                }
                await publish_raw(js, settings, "acme", "schedule", body)
            await until(lambda: all(row(db_url, "acme", p) is not None for p in policies), what="stored")
        # No replica runs while the occurrences at +0 s, +1 s, ... +4 s come due, and downtime passes.
        missed_until = epoch(first) + 4.5
        await until(
            lambda: query(db_url, "SELECT extract(epoch FROM now()) > %s", missed_until)[0][0],
            timeout=15,
            what="downtime",
        )
        async with running_replica(settings, **QUICK_DOWNTIME):
            await until(
                lambda: all(
                    sum(1 for f in rec.firings if f.service_call_id == p and f.due_at > missed_until) >= 2
                    for p in policies
                ),
                timeout=20,
                what="each on schedule again",
            )

    def missed(policy: str) -> list[int]:  # the indexes of the missed occurrences that fired
        fired = [f for f in rec.firings if f.service_call_id == policy and f.due_at < missed_until]
        return sorted(round(f.due_at - epoch(first)) for f in fired)

    assert missed("one") == [0]  # the awaited occurrence, late; the rest skipped
    assert missed("none") == []  # every missed occurrence skipped
    all_fired = [f for f in rec.firings if f.service_call_id == "all" and f.due_at < missed_until]
    assert missed("all") == [0, 1, 2, 3, 4]  # each, once, with its own event id
    assert [f.due_at for f in all_fired] == sorted(f.due_at for f in all_fired)  # oldest first
    assert len({f.msg_id for f in all_fired}) == 5
    skipped = row(db_url, "acme", "none")
    assert skipped is not None and skipped["caught_up"] is None


async def test_catchup_all_fires_at_most_catchup_max_in_a_row_then_jumps_to_now(
    store: Store, db_url: str
) -> None:
    # A timer of catch-up "all" that has fired CATCHUP_MAX - 1 missed occurrences in a row, its
    # next still long overdue: this claim takes the reference to now, as after downtime.
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every,"
        " repeat_catchup, caught_up, occurrence_index, claimed_at, updated_at)"
        " VALUES ('acme', 'behind', 'Scheduled', now() - interval '1 day', now() - interval '2 days',"
        " 'PT1M', 'all', %s, 1440, now() - interval '2 days', now())",
        CATCHUP_MAX - 1,
    )
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000, downtime_ms=60_000))
    (behind,) = batch.result.claimed
    await batch.close()
    assert behind.recurrence_ref > behind.due_at + timedelta(hours=23)  # now, not the carried one
    # One short of it, the carried reference stays: the next missed one fires too.
    query(
        db_url,
        "UPDATE timers SET caught_up = %s, lease_expires_at = NULL, claimed_at = now() - interval '2 days'",
        CATCHUP_MAX - 2,
    )
    batch = await store.claim(claim_params("a", 10, lease_ms=10_000, downtime_ms=60_000))
    (again,) = batch.result.claimed
    await batch.close()
    assert again.recurrence_ref < again.due_at
