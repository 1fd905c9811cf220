"""Review of "one transaction per claim batch": each test here failed on main when it was written
(branch review-batch); see the commit that added it for the defect it shows."""

from __future__ import annotations

from tests.helpers import query
from worker.adapters import db
from worker.adapters.store import Store
from worker.contract import PauseTimers
from worker.core.domain import ClaimParams, Fired, Position
from worker.core.firing import next_of


async def test_a_timers_pause_deferred_behind_a_batch_in_flight_does_not_undo_its_later_resume(
    db_url: str,
) -> None:
    """A timer's pauses and resumes apply in stream order (README, Pause and resume). A Pause of a
    recurring timer whose occurrence a batch in flight holds is deferred (pause_timer: `claimed`);
    the Resume after it, delivered once that batch is recorded, finds nothing paused. When the
    Pause comes back (its NAK delay), it must not pause the timer again: the last word was Resume."""
    query(
        db_url,
        "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, repeat_every)"
        " VALUES ('acme', 'tick', 'Scheduled', now() - interval '1 s', now() - interval '1 s', 'PT1H')",
    )
    async with db.pool(db_url, "review", min_size=1, max_size=2, idle_in_transaction_ms=60_000) as pool:
        store = Store(pool)
        batch = await store.claim(ClaimParams("firing", 10, 2, 10_000, 0, 2000, 60_000))
        (held,) = batch.result.claimed
        (stored_at,) = query(db_url, "SELECT now()")[0]
        pause, resume = PauseTimers("acme", "tick", resume=False), PauseTimers("acme", "tick", resume=True)
        assert (await store.pause(pause, Position(10, stored_at))).outcomes == ["deferred"]
        assert await batch.record([Fired(held, *next_of(held))], []) == 1
        await store.pause(resume, Position(11, stored_at))  # nothing to resume yet: ignored
        await store.pause(pause, Position(10, stored_at))  # the deferred Pause, redelivered
    assert query(db_url, "SELECT state, paused_at IS NOT NULL FROM timers") == [("Scheduled", False)]
