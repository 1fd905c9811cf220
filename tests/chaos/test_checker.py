"""The chaos checker catches each kind of violation: fed histories known to be bad, it counts them."""

from __future__ import annotations

from tests.chaos.checker import Event, Row, check, lost_outside
from tests.chaos.workload import RECURRING_EVERY_S, Timer

T0 = 1_800_000_000_000
EVERY = RECURRING_EVERY_S * 1000


def fired(t: Timer, due: int, late: int = 5, msg_id: str | None = None) -> Event:
    return Event(msg_id or f"{t.tenant}:{t.id}:{due}", t.key, due, due + late, due + late + 1)


def good_history() -> tuple[list[Timer], list[Event], dict[tuple[str, str], Row]]:
    plain = Timer("acme", "p", "plain", [T0])
    moved = Timer("acme", "r", "reschedule", [T0, T0 + 2000])
    cancelled = Timer("acme", "c", "cancel", [T0])
    late_cancel = Timer("acme", "lc", "cancel", [T0])
    recurring = Timer("acme", "rec", "recurring", [T0])
    events = [fired(plain, T0), fired(moved, T0 + 2000), fired(late_cancel, T0)]
    events += [fired(recurring, due) for due in recurring.occurrences()]
    rows = {
        plain.key: Row("Reached", T0, False),
        moved.key: Row("Reached", T0 + 2000, False),
        cancelled.key: Row("Cancelled", None, False),
        late_cancel.key: Row("Reached", T0, False),  # the cancel came after the claim
        recurring.key: Row("Reached", recurring.occurrences()[-1], False),
    }
    return [plain, moved, cancelled, late_cancel, recurring], events, rows


def test_a_clean_history_passes() -> None:
    timers, events, rows = good_history()
    v = check(timers, events, rows, [("acme", b"x"), ("_invalid", b"y")], {("acme", b"x"), ("bad$", b"y")})
    assert v.ok, v.examples
    assert (v.cancels_effective, v.reschedules_effective, v.dup_raw) == (1, 1, 0)


def test_every_violation_is_counted() -> None:
    timers, events, rows = good_history()
    plain, moved, cancelled, _, recurring = timers
    events = [e for e in events if e.key != plain.key]  # lost
    events.append(fired(moved, T0))  # superseded: the reschedule was applied, the old dueAt fired
    events.append(fired(cancelled, T0))  # fired although the cancel took effect
    events.append(Event("x", ("acme", "p2"), T0, T0, T0 - 5))  # early, and nobody scheduled it
    events.append(fired(recurring, T0, msg_id="other-id"))  # a firing with a second id
    rows[recurring.key] = Row("Reached", T0, True)  # left leased
    v = check(timers, events, rows, [("acme", b"x"), ("acme", b"x"), ("acme", b"z")], {("acme", b"x")})
    assert (v.lost, v.superseded, v.after_cancel, v.early, v.unexpected) == (1, 1, 1, 1, 1)
    assert (v.leased, v.dup_raw, v.dup_after_id) == (1, 1, 1)
    assert (v.dlq_missing, v.dlq_extra, v.dlq_dup) == (0, 1, 1)
    assert not v.ok


def test_a_recurring_skip_is_allowed_only_in_an_outage_for_an_occurrence_due_before_the_late_firing() -> None:
    t = Timer("acme", "rec", "recurring", [T0])
    first, second, third, fourth = t.occurrences()
    row = {t.key: Row("Reached", fourth, False)}
    outage = [(first - 500, first + 500)]  # Postgres or NATS down around occurrence 0
    # Occurrence 0 fired so late that 1 was already due, in an outage: the downtime rule.
    late = [fired(t, first, late=EVERY + 10), fired(t, third), fired(t, fourth)]
    assert check([t], late, row, [], set(), outage).skipped_occurrences == 1
    # Occurrence 0 fired on time: nothing may be skipped, a missing occurrence 1 is lost.
    on_time = [fired(t, first), fired(t, third), fired(t, fourth)]
    v = check([t], on_time, row, [], set(), outage)
    assert (v.lost, v.skipped_occurrences) == (1, 0)
    # A re-fire a lease later does not excuse a skip: the first publish counts.
    refired = [fired(t, first), fired(t, first, late=EVERY + 10), fired(t, third), fired(t, fourth)]
    assert check([t], refired, row, [], set(), outage).lost == 1
    assert second not in {e.due_ms for e in refired}


def test_a_recurring_skip_after_a_replica_crash_is_lost() -> None:
    # The late firing of occurrence 0 is what a plain replica kill looks like (re-fired after the
    # lease): with no outage recorded, or one long over, the skipped occurrence 1 is a violation.
    t = Timer("acme", "rec", "recurring", [T0])
    first, second, third, fourth = t.occurrences()
    row = {t.key: Row("Reached", fourth, False)}
    late = [fired(t, first, late=EVERY + 10), fired(t, third), fired(t, fourth)]
    for outages in ([], [(first - 60_000, first - 55_000)], [(fourth + 10_000, fourth + 12_000)]):
        v = check([t], late, row, [], set(), outages)
        assert (v.lost, v.skipped_occurrences) == (1, 0), outages
        assert not v.ok
        assert any(f"occurrence 1 at {second}" in e for e in v.examples)


def test_the_status_says_pass_fail_or_an_expected_loss_within_its_window() -> None:
    timers, events, rows = good_history()
    plain = timers[0]
    plain.stored = [80]
    assert check(timers, events, rows, [], set()).status() == "PASS"
    lost = check(timers, [e for e in events if e.key != plain.key], rows, [], set())
    assert lost.status() == "FAIL"  # no loss expected: a loss is a failure
    # Expected in a window: sent inside it, the loss is what the scenario predicts.
    inside = (70, 90)
    assert lost_outside(lost, timers, inside) == []
    assert lost.status(lost_outside(lost, timers, inside)) == "EXPECTED-LOSS lost_in_window=1/1"
    # Sent outside it: a real loss, whatever the scenario expected.
    outside = lost_outside(lost, timers, (100, 200))
    assert outside == [plain.key]
    assert lost.status(outside) == "FAIL lost_in_window=0/1"
    # Nothing lost where a loss was expected: the fault did not happen as planned.
    clean = check(timers, events, rows, [], set())
    assert clean.status([]).startswith("FAIL lost_in_window=0/0 (nothing lost")
    # A loss in its window beside another violation is no expected loss.
    rows[plain.key] = Row("Scheduled", T0, True)
    leased = check(timers, [e for e in events if e.key != plain.key], rows, [], set())
    assert leased.status([]) == "FAIL lost_in_window=1/1 other_violations=yes"
