"""A timer's commands apply in stream order (README, Ordering): the decision, on plain values.

The intake store (adapters/postgres/store.py, Store.apply) runs the statements of one batch's
transaction (sql/queries/intake.sql); what to make of their answers is decided here, round after
round: which commands a round sends, which wait and why, each command's outcome, and the markers
of the commands waiting for their timer (its deferred_seqs).

- A batch is split into rounds in which each key appears once, each key's commands in stream
  order: one INSERT ... ON CONFLICT cannot touch a row twice, and applying a key's commands round
  after round is applying them one by one.
- A key whose row a claim's batch in flight holds (lock_keys) waits from the start: "deferred" when
  the claim may fire it, "busy" when it cannot (offered again soon, not a lease later); no marker
  is written for it (writing one would wait on the lock).
- A command the statements left alone waits when its timer's occurrence is claimed ("stuck" past
  TIMER_STUCK_AFTER: given up), or when it comes later in the stream than the oldest command
  already waiting for the timer (`head`); every later command of that key in the batch waits too.
- A waiting command joins the timer's marker; a command that no longer waits (ignored, given up)
  leaves it; an applied one left it in its own statement.
- A timer's own pause or resume followed in the batch by another of the timer, with no
  ScheduleTimer or CancelTimer of it between, is moot (superseded_controls): intake applies a run
  of pauses and resumes together, each timer once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from worker.contract import Command, PauseTimers
from worker.core.domain import BulkAction, Key, Outcome


@dataclass(frozen=True, slots=True)
class Held:
    """Why a key's commands may wait, as the store read it (held_among)."""

    claimed: bool  # its occurrence is claimed: they wait for it to be recorded
    stuck: bool  # claimed for longer than TIMER_STUCK_AFTER: they are given up
    head: int | None  # the stream sequence of the oldest command waiting for it, if live
    marked: bool  # some command is recorded as waiting (live or stale)
    due_at: datetime | None  # Scheduled and no lease holds it: a claim may have skipped it


@dataclass(frozen=True, slots=True)
class Marker:
    """A command joining (`waits`) or leaving the timer's commands waiting for it (deferred_seqs)."""

    key: Key
    seq: int
    waits: bool


def rounds(keys: Sequence[Key], seqs: Sequence[int | None]) -> list[list[int]]:
    """The batch's indexes in rounds in which each key appears once, each key's in stream order
    when every command's sequence is known (a fetch may hand a redelivered command after a newer
    one), else in the batch's."""
    order: Sequence[int] = range(len(keys))
    if seqs and all(s is not None for s in seqs):
        order = sorted(order, key=lambda i: seqs[i] or 0)
    seen: dict[Key, int] = {}
    out: list[list[int]] = []
    for i in order:
        r = seen.get(keys[i], 0)
        seen[keys[i]] = r + 1
        if r == len(out):
            out.append([])
        out[r].append(i)
    return out


class StreamOrder:
    """One batch's decision: built from its commands' keys, their stream sequences (None: not
    known, no order to keep) and the keys a claim's batch holds (lock_keys: whether it may fire
    them); then told, round after round, what the statements changed and what held_among says."""

    def __init__(self, keys: Sequence[Key], seqs: Sequence[int | None], locked: Mapping[Key, bool]) -> None:
        self.keys = keys
        self.seqs = seqs
        self.locked = locked
        self.rounds = rounds(keys, seqs)
        self.outcomes: list[Outcome] = ["ignored"] * len(keys)
        # Keys whose commands wait, and why: "deferred", "busy" or "stuck".
        self.waiting: dict[Key, Outcome] = {
            k: "deferred" if claimable else "busy" for k, claimable in locked.items()
        }

    def to_send(self, indexes: Sequence[int]) -> list[int]:
        """Of a round, the commands the statements should try: those whose key does not wait."""
        return [i for i in indexes if self.keys[i] not in self.waiting]

    def unchanged(self, sent: Sequence[int], changed: Collection[Key]) -> list[Key]:
        """The keys of sent commands the statements left alone: the store asks held_among why."""
        return [self.keys[i] for i in sent if self.keys[i] not in changed]

    def decide(
        self, indexes: Sequence[int], sent: Sequence[int], changed: Collection[Key], held: Mapping[Key, Held]
    ) -> list[Marker]:
        """Each command's outcome in this round, and the markers to write for it."""
        keys, seqs, waiting = self.keys, self.seqs, self.waiting
        for i in sent:
            h = held.get(keys[i])
            if keys[i] in changed or h is None:
                continue
            seq = seqs[i]
            if h.claimed:
                waiting[keys[i]] = "stuck" if h.stuck else "deferred"
            elif h.head is not None and seq is not None and seq > h.head:
                waiting[keys[i]] = "deferred"  # behind an older waiting command
        markers: list[Marker] = []
        for i in indexes:
            key, seq = keys[i], seqs[i]
            if key in changed:
                self.outcomes[i] = "applied"  # and left deferred_seqs in the same statement
            elif key in waiting:
                self.outcomes[i] = waiting[key]
                if seq is not None and key not in self.locked:
                    markers.append(Marker(key, seq, waiting[key] == "deferred"))
            elif seq is not None and (h := held.get(key)) is not None and h.marked:
                markers.append(Marker(key, seq, False))  # ignored: it waits no more
        return markers


def superseded_controls(commands: Sequence[Command | PauseTimers | BulkAction]) -> set[int]:
    """The indexes of the timers' pauses and resumes that the batch makes moot: each followed in it
    by another of the same timer with no ScheduleTimer or CancelTimer of it between. What is left of
    a run of them with no ScheduleTimer or CancelTimer between names each timer once."""
    superseded: set[int] = set()
    timer_last: dict[tuple[str, str], int] = {}
    for i, command in enumerate(commands):
        if isinstance(command, BulkAction):
            continue  # the lane's; a timer's own controls keep their order
        if isinstance(command, PauseTimers):
            if command.service_call_id is not None:
                key = (command.tenant_id, command.service_call_id)
                if (earlier := timer_last.get(key)) is not None:
                    superseded.add(earlier)
                timer_last[key] = i
        else:
            timer_last.pop((command.tenant_id, command.service_call_id), None)
    return superseded
