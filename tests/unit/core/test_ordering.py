"""A timer's commands in stream order, decided on plain values (worker/core/ordering.py): the
rounds, each command's outcome, the markers of the commands waiting for their timer, and the
pauses and resumes a batch makes moot."""

from __future__ import annotations

import random

from worker.contract import CancelTimer, PauseTimers
from worker.core.commands import Parsed
from worker.core.domain import BulkAction
from worker.core.ordering import Held, Marker, StreamOrder, rounds, superseded_controls

A, B = ("t", "a"), ("t", "b")


def held(claimed: bool = False, stuck: bool = False, head: int | None = None, waiting: bool = False) -> Held:
    return Held(claimed=claimed, stuck=stuck, head=head, waiting=waiting, due_at=None)


def test_rounds_hold_each_key_once_in_stream_order() -> None:
    # A redelivered command (seq 3) fetched after a newer one of its key (seq 7) still goes first.
    assert rounds([A, B, A, A], [7, 5, 3, 9]) == [[2, 1], [0], [3]]


def test_without_positions_rounds_keep_the_batch_order() -> None:
    assert rounds([A, A, B], [None, None, None]) == [[0, 2], [1]]


def test_a_key_a_claims_batch_holds_waits_without_a_marker() -> None:
    order = StreamOrder([A, B], [1, 2], {A: True, B: False})
    (only,) = order.rounds
    assert order.to_send(only) == []
    assert order.decide(only, [], set(), {}) == []  # writing a marker would wait on the lock
    assert order.outcomes == ["deferred", "busy"]


def test_commands_the_statements_changed_are_applied() -> None:
    order = StreamOrder([A, B], [1, 2], {})
    (only,) = order.rounds
    assert order.unchanged(order.to_send(only), {A, B}) == []
    assert order.decide(only, order.to_send(only), {A, B}, {}) == []
    assert order.outcomes == ["applied", "applied"]


def test_a_claimed_timer_defers_its_commands_and_marks_them_waiting() -> None:
    order = StreamOrder([A, A, B], [1, 2, 3], {})
    first, second = order.rounds
    sent = order.to_send(first)
    assert order.unchanged(sent, set()) == [A, B]
    markers = order.decide(first, sent, set(), {A: held(claimed=True), B: held(claimed=True, stuck=True)})
    assert markers == [Marker(A, 1, True), Marker(B, 3, False)]  # a given-up command waits no more
    # The key's later command waits behind it without being sent.
    assert order.to_send(second) == []
    assert order.decide(second, [], set(), {}) == [Marker(A, 2, True)]
    assert order.outcomes == ["deferred", "deferred", "stuck"]


def test_a_command_behind_an_older_waiting_one_waits_too() -> None:
    order = StreamOrder([A, B], [12, 8], {})
    (only,) = order.rounds
    sent = order.to_send(only)
    markers = order.decide(
        only, sent, set(), {A: held(head=10, waiting=True), B: held(head=10, waiting=True)}
    )
    # A (12) comes after the oldest waiting command (10): it waits. B (8) does not, and was left
    # alone by the statements (older than the last applied): ignored, and off the marker.
    assert order.outcomes == ["deferred", "ignored"]
    assert markers == [Marker(B, 8, False), Marker(A, 12, True)]


def test_without_positions_no_marker_is_written() -> None:
    order = StreamOrder([A, B], [None, None], {})
    (only,) = order.rounds
    sent = order.to_send(only)
    assert order.decide(only, sent, set(), {A: held(claimed=True), B: held(head=1, waiting=True)}) == []
    assert order.outcomes == ["deferred", "ignored"]


def test_a_timers_control_is_moot_only_before_another_of_it_with_no_schedule_or_cancel_between() -> None:
    batch: list[Parsed] = [
        PauseTimers("t", "a", False),  # moot: the resume after it
        PauseTimers("u", "a", False),  # another tenant's timer a
        BulkAction("t", {"g": "1"}, "pause"),  # the lane's: no cut
        PauseTimers("t", "a", True),
        CancelTimer("t", "a", None, None),
        PauseTimers("t", "a", False),  # a cancel between: not moot
        PauseTimers("t", None, False),  # the tenant's: the lane's
    ]
    assert superseded_controls(batch) == {0}


def test_what_is_left_of_a_run_of_controls_names_each_timer_once() -> None:
    """Intake applies a run of one timer's pauses and resumes with no ScheduleTimer or CancelTimer
    between as one statement, which takes each timer once (pausing.pause_timers)."""
    rng = random.Random(7)
    for _ in range(500):
        batch: list[Parsed] = []
        for _ in range(rng.randint(1, 30)):
            tenant, key = rng.choice("tu"), rng.choice("abc")
            batch.append(
                rng.choice(
                    [
                        PauseTimers(tenant, key, rng.random() < 0.5),
                        PauseTimers(tenant, None, False),
                        BulkAction(tenant, {"g": "1"}, "resume"),
                        CancelTimer(tenant, key, None, None),
                    ]
                )
            )
        moot = superseded_controls(batch)
        run: list[tuple[str, str | None]] = []
        for i, command in enumerate(batch):
            if isinstance(command, CancelTimer):
                run = []
            elif isinstance(command, PauseTimers) and command.service_call_id is not None and i not in moot:
                key_of = (command.tenant_id, command.service_call_id)
                assert key_of not in run, batch
                run.append(key_of)
