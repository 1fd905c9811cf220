"""A timer's commands apply in stream order (README, Ordering): the decision, on plain values, round
after round, over the answers of the intake store's statements.

- Rounds hold each key once, in stream order: one INSERT ... ON CONFLICT cannot touch a row twice.
- A key a claim's batch holds waits: "deferred" if the claim may fire it, else "busy".
- A command left alone waits while its occurrence is claimed ("stuck" past TIMER_STUCK_AFTER) or
  behind an older waiting command; later commands of that key wait too."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from worker.contract import Command, PauseTimers
from worker.core.domain import BulkAction, Key, Outcome


@dataclass(frozen=True, slots=True)
class Held:
    """Why a key's commands may wait, as the store read it (held_among)."""

    claimed: bool
    stuck: bool
    head: int | None  # the oldest waiting command's stream sequence, if live
    waiting: bool  # any of its commands is recorded as waiting (deferred_seqs)
    due_at: datetime | None  # Scheduled and unleased: a claim may have skipped it


@dataclass(frozen=True, slots=True)
class Marker:
    """A command joining (`waits`) or leaving the timer's commands waiting for it (deferred_seqs)."""

    key: Key
    seq: int
    waits: bool


def rounds(keys: Sequence[Key], seqs: Sequence[int | None]) -> list[list[int]]:
    """The batch's indexes in rounds with each key once, in stream order when every sequence is known."""
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
    """One batch's decision: told, round after round, what the statements changed and why keys were
    held."""

    def __init__(self, keys: Sequence[Key], seqs: Sequence[int | None], locked: Mapping[Key, bool]) -> None:
        self.keys = keys
        self.seqs = seqs
        self.locked = locked
        self.rounds = rounds(keys, seqs)
        self.outcomes: list[Outcome] = ["ignored"] * len(keys)
        self.waiting: dict[Key, Outcome] = {
            k: "deferred" if claimable else "busy" for k, claimable in locked.items()
        }

    def to_send(self, indexes: Sequence[int]) -> list[int]:
        return [i for i in indexes if self.keys[i] not in self.waiting]

    def unchanged(self, sent: Sequence[int], changed: Collection[Key]) -> list[Key]:
        return [self.keys[i] for i in sent if self.keys[i] not in changed]

    def decide(
        self, indexes: Sequence[int], sent: Sequence[int], changed: Collection[Key], held: Mapping[Key, Held]
    ) -> list[Marker]:
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
                self.outcomes[i] = "applied"
            elif key in waiting:
                self.outcomes[i] = waiting[key]
                if seq is not None and key not in self.locked:
                    markers.append(Marker(key, seq, waiting[key] == "deferred"))
            elif seq is not None and (h := held.get(key)) is not None and h.waiting:
                markers.append(Marker(key, seq, False))  # ignored: it waits no more
        return markers


def superseded_controls(commands: Sequence[Command | PauseTimers | BulkAction]) -> set[int]:
    """The indexes of timers' pauses and resumes the batch makes moot: followed by another of the same
    timer with no ScheduleTimer or CancelTimer of it between."""
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
