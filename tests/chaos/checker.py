"""Checks a chaos run, timer by timer: what was sent against every DueTimeReached received, the
final rows, and the DLQ.

The final row only decides which of the outcomes the plan allows happened, never whether one
is allowed: a cancel or reschedule that reached the service after the claim is applied after the
firing (README, guarantees), so a `cancel` timer may end Cancelled (and must then never have
fired) or Reached at its first dueAt; a `reschedule` timer Reached at either dueAt, and must
then have fired at that one only. A plain timer has one outcome: Reached at its dueAt.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.chaos.workload import Timer
from worker.contract import INVALID_TENANT, is_valid_tenant

Key = tuple[str, str]
Window = tuple[int, int]  # command stream sequences, from and to

# A recurring occurrence may be skipped only in real downtime: around a recorded outage of
# Postgres or NATS, never for a replica crash. Widened before by a lease (a claim made just
# before the outage hides its timer that long) and after by the fleet's recovery (reconnecting,
# then claiming again within a poll interval of its back-off).
OUTAGE_BEFORE_MS = 3000
OUTAGE_AFTER_MS = 5000


@dataclass(frozen=True)
class Event:
    msg_id: str
    key: Key
    due_ms: int
    reached_ms: int  # the replica's database-clock time at publish
    received_ms: int  # when the checker's consumer got it (this machine's clock)


@dataclass(frozen=True)
class Row:
    state: str
    due_ms: int | None
    leased: bool


@dataclass
class Verdict:
    timers: int = 0
    events: int = 0
    lost: int = 0
    early: int = 0
    superseded: int = 0
    after_cancel: int = 0
    unexpected: int = 0  # events for keys nobody scheduled
    leased: int = 0
    dup_raw: int = 0  # deliveries beyond one per firing (JetStream dedupe missed them)
    dup_after_id: int = 0  # left after dropping repeated ids: firings with two ids
    skipped_occurrences: int = 0  # recurring occurrences skipped in an outage (the downtime rule)
    cancels_effective: int = 0
    reschedules_effective: int = 0
    dlq_expected: int = 0
    dlq_missing: int = 0
    dlq_extra: int = 0
    dlq_dup: int = 0
    max_late_ms: int = 0  # received - dueAt: includes the checker's own consumer catching up
    p99_late_ms: int = 0
    p99_publish_late_ms: int = 0  # reachedAt - dueAt: the service's own lateness
    max_publish_late_ms: int = 0
    examples: list[str] = field(default_factory=list)
    lost_keys: set[Key] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.lost and self.clean_but_lost

    @property
    def clean_but_lost(self) -> bool:
        """Nothing wrong but lost timers: what a scenario that expects a loss may still call right."""
        bad = (self.early, self.superseded, self.after_cancel, self.unexpected, self.leased)
        return not any(bad) and not self.dlq_missing and not self.dlq_extra and not self.dup_after_id

    def status(self, lost_outside: Sequence[Key] | None = None) -> str:
        """The word a chaos line starts with, true for anyone reading CI output alone.

        `lost_outside`: for a scenario that expects a loss in a window (asynchronous replication),
        the lost timers none of whose commands was stored in it; None when no loss is expected.
        An expected loss is EXPECTED-LOSS only when it happened (the fault was real), stayed
        within its window and nothing else went wrong; otherwise FAIL, saying which check failed.
        """
        if lost_outside is None:
            return "PASS" if self.ok else "FAIL"
        in_window = f"lost_in_window={self.lost - len(lost_outside)}/{self.lost}"
        if self.lost and not lost_outside and self.clean_but_lost:
            return f"EXPECTED-LOSS {in_window}"
        why = "" if self.clean_but_lost else " other_violations=yes"
        return f"FAIL {in_window}{why}" + (
            " (nothing lost: the fault tested nothing)" if not self.lost else ""
        )

    def lose(self, key: Key, what: str) -> None:
        self.lost += 1
        self.lost_keys.add(key)
        self.note(f"lost: {what}")

    def note(self, what: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(what)

    def line(self) -> str:
        return (
            f"timers={self.timers} events={self.events} lost={self.lost} early={self.early} "
            f"superseded={self.superseded} after_cancel={self.after_cancel} leased={self.leased} "
            f"unexpected={self.unexpected} dlq={self.dlq_expected - self.dlq_missing}/{self.dlq_expected} "
            f"dlq_extra={self.dlq_extra} dup_raw={self.dup_raw} dup_after_id={self.dup_after_id} "
            f"cancels_effective={self.cancels_effective} reschedules_effective={self.reschedules_effective} "
            f"skipped_occurrences={self.skipped_occurrences} p99_publish_late_ms={self.p99_publish_late_ms} "
            f"max_publish_late_ms={self.max_publish_late_ms} p99_late_ms={self.p99_late_ms} "
            f"max_late_ms={self.max_late_ms}"
        )


def check(
    timers: list[Timer],
    events: list[Event],
    rows: dict[Key, Row],
    dlq: list[tuple[str, bytes]],
    poison: set[tuple[str, bytes]],
    outages: Sequence[Window] = (),
) -> Verdict:
    v = Verdict(timers=len(timers), events=len(events))
    by_key: dict[Key, list[Event]] = defaultdict(list)
    for e in events:
        by_key[e.key].append(e)
        if e.received_ms < e.due_ms or e.reached_ms < e.due_ms:
            v.early += 1
            v.note(f"early: {e.msg_id} received {e.due_ms - e.received_ms} ms before due")
    late = sorted(e.received_ms - e.due_ms for e in events)
    if late:
        v.max_late_ms, v.p99_late_ms = late[-1], _p99(late)
        published = sorted(e.reached_ms - e.due_ms for e in events)
        v.p99_publish_late_ms, v.max_publish_late_ms = _p99(published), published[-1]
    planned = {t.key for t in timers}
    v.unexpected = sum(len(es) for k, es in by_key.items() if k not in planned)
    for t in timers:
        fired = by_key.get(t.key, [])
        firings = {e.due_ms for e in fired}
        v.dup_raw += len(fired) - len(firings)
        v.dup_after_id += len({e.msg_id for e in fired}) - len(firings)
        row = rows.get(t.key)
        if t.kind == "recurring":
            _check_recurring(v, t, fired, row, outages)
        else:
            _check_single(v, t, firings, row)
        if row is not None and row.leased:
            v.leased += 1
            v.note(f"leased: {t.key}")
    _check_dlq(v, dlq, poison)
    return v


def lost_outside(v: Verdict, timers: Sequence[Timer], window: Window) -> list[Key]:
    """The lost timers none of whose commands was stored within `window` (command stream
    sequences, inclusive)."""
    stored = {t.key: t.stored for t in timers}
    return sorted(k for k in v.lost_keys if not any(window[0] <= s <= window[1] for s in stored.get(k, [])))


def _p99(ordered: list[int]) -> int:
    return ordered[int(0.99 * (len(ordered) - 1))]


def _check_single(v: Verdict, t: Timer, firings: set[int], row: Row | None) -> None:
    if row is not None and row.state == "Cancelled" and t.kind == "cancel":
        v.cancels_effective += 1
        if firings:
            v.after_cancel += 1
            v.note(f"fired after cancel: {t.key}")
        return
    allowed = t.dues if t.kind == "reschedule" else t.dues[:1]
    if row is None or row.state != "Reached" or row.due_ms not in allowed:
        v.lose(t.key, f"{t.kind} {t.key} ends as {row}, sent {t.dues}")
        return
    if t.kind == "reschedule" and row.due_ms == t.dues[-1]:
        v.reschedules_effective += 1
    if row.due_ms not in firings:
        v.lose(t.key, f"{t.kind} {t.key} Reached at {row.due_ms}, fired {sorted(firings)}")
    if wrong := firings - {row.due_ms}:
        v.superseded += len(wrong)
        v.note(f"superseded: {t.kind} {t.key} fired {sorted(wrong)}, final dueAt {row.due_ms}")


def _check_recurring(
    v: Verdict, t: Timer, fired: list[Event], row: Row | None, outages: Sequence[Window]
) -> None:
    """Every occurrence fires, except one the downtime rule skips: the next occurrence is the first
    due after the one before was claimed (docs/USING.md, recurring timers), which is no later than its
    first publish, so a skip is allowed only for an occurrence due by then, and only in downtime
    (an outage the scenario recorded): a crash skips nothing."""
    occurrences = t.occurrences()
    reached: dict[int, int] = {}
    for e in fired:
        reached[e.due_ms] = min(reached.get(e.due_ms, e.reached_ms), e.reached_ms)
    if wrong := set(reached) - set(occurrences):
        v.superseded += len(wrong)
        v.note(f"superseded: recurring {t.key} fired {sorted(wrong)} outside {occurrences}")
    previous: int | None = None  # reachedAt of the last occurrence that fired
    for k, due in enumerate(occurrences):
        if due in reached:
            previous = reached[due]
        elif previous is not None and due <= previous + 1 and _in_outage(due, outages):  # ms cut
            v.skipped_occurrences += 1
        else:
            v.lose(t.key, f"recurring {t.key} occurrence {k} at {due}, fired {sorted(reached)}")
    if row is None or row.state != "Reached":
        v.lose(t.key, f"recurring {t.key} ends as {row}")


def _in_outage(at_ms: int, outages: Sequence[Window]) -> bool:
    return any(start - OUTAGE_BEFORE_MS <= at_ms <= end + OUTAGE_AFTER_MS for start, end in outages)


def _check_dlq(v: Verdict, dlq: list[tuple[str, bytes]], poison: set[tuple[str, bytes]]) -> None:
    expected = {(token if is_valid_tenant(token) else INVALID_TENANT, body) for token, body in poison}
    got = set(dlq)
    v.dlq_expected = len(expected)
    v.dlq_missing = len(expected - got)
    v.dlq_extra = len(got - expected)
    v.dlq_dup = len(dlq) - len(got)
    for token, body in sorted(expected - got)[:3]:
        v.note(f"dlq missing: {token} {body[:60]!r}")
    for token, body in sorted(got - expected)[:3]:
        v.note(f"dlq extra: {token} {body[:60]!r}")
