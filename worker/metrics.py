"""Prometheus metrics, named like the events they count. Documented in docs/OPERATIONS.md."""

from __future__ import annotations

import bisect
import collections
import math
import platform
import time
from collections.abc import Sequence

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from worker import __version__
from worker.contract import REASONS

# No `_created` twin series: they double what Prometheus stores, and nothing here reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Sub-millisecond at the low end, to resolve a p50 of a few ms; the lateness alert reads 1 s.
# fmt: off
_LATENESS_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  # on time
    1, 2.5, 5, 10, 30, 60, 300, 3600,  # late
)
# fmt: on

COMMANDS_RECEIVED = Counter("timer_commands_received_total", "Commands taken from the stream", ["kind"])
COMMANDS_APPLIED = Counter(
    "timer_commands_applied_total",
    "Valid commands by outcome: applied, ignored (no-op), deferred (occurrence claimed), busy (row held"
    " by a batch not firing it), superseded",
    ["kind", "outcome"],
)
BULK_TIMERS = Counter(
    "timer_bulk_timers_total",
    "Timers a bulk action (a cancel, pause or resume naming labels) acted on, by their outcome",
    ["kind", "outcome"],
)
for _kind in ("cancel", "pause", "resume"):  # at 0 from start-up, for rate()
    BULK_TIMERS.labels(_kind, "applied")
BULK_HELD = Gauge(
    "timer_bulk_held",
    "Commands on many timers (bulk actions, a tenant's pause or resume) the bulk lane holds",
)
COMMANDS_REJECTED = Counter("timer_commands_rejected_total", "Invalid commands sent to the DLQ", ["reason"])
COMMAND_SETTLE_FAILED = Counter(
    "timer_command_settle_failed_total",
    "Command acknowledgements NATS could not take (reconnecting); the command is redelivered",
)
COMMANDS_PURGED = Counter(
    "timer_commands_purged_total",
    "Acknowledged commands purged from a limits command stream (below the consumer's ack floor)",
)
for _reason in sorted(REASONS):
    # At 0 from the start, for rate().
    COMMANDS_REJECTED.labels(_reason)
CARRIED_HEADERS_DROPPED = Counter(
    "timer_carried_headers_dropped_total",
    "Invalid traceparent, tracestate or allowed producer headers of a ScheduleTimer, not carried",
)
COMMAND_BATCH_SECONDS = Histogram(
    "timer_command_batch_seconds", "Time to commit one intake batch", buckets=_LATENCY_BUCKETS
)

WAKE_HINTS_DROPPED = Counter(
    "timer_wake_hints_dropped_total",
    "Wake-subject messages that woke no claim: rate-limited, not a replica's, or unreadable",
    ["reason"],
)
for _why in ("limited", "foreign", "unreadable"):
    WAKE_HINTS_DROPPED.labels(_why)
GET_REPLIES_REFUSED = Counter(
    "timer_get_replies_refused_total",
    "get requests not answered: their reply subject is not an inbox (docs/SECURITY.md)",
)
GET_REQUESTS_SHED = Counter(
    "timer_get_requests_shed_total",
    "get requests dropped unanswered, before any lookup: their tenant had 1000 gets (or 1 MiB) waiting"
    " on this replica already, and its oldest went",
)
CLAIMED = Counter("timer_claimed_total", "Occurrences claimed under a lease")
LEASES_RECLAIMED = Counter(
    "timer_leases_reclaimed_total", "Claims of occurrences whose earlier lease ran out (crash or retry)"
)
FIRED = Counter("timer_fired_total", "DueTimeReached events acknowledged by JetStream")
CATCHUP_SKIPPED = Counter(
    "timer_catchup_skipped_total",
    "Missed occurrences skipped, not fired: repeat.catchup none, after downtime",
)
EXPIRED = Counter(
    "timer_expired_total",
    "Occurrences not fired: later than their expireAfter (a DLQ entry each, reason expired)",
)
RECORDED = Counter("timer_marked_total", "Firings recorded in Postgres")
FENCE_REJECTED = Counter("timer_fence_rejected_total", "Records refused because the lease was lost")
PUBLISH_FAILED = Counter("timer_publish_failures_total", "Publishes that failed or timed out")
FIRE_ERRORS = Counter(
    "timer_fire_errors_total",
    "Claimed occurrences whose row could not be made into an event; retried with back-off",
    ["reason"],
)
for _reason in ("unreadable_due_at", "due_at_out_of_range", "bad_repeat", "event_too_large"):
    FIRE_ERRORS.labels(_reason)
POSTPONED = Counter(
    "timer_postponed_total",
    "Claimed occurrences put back for a later claim, the replica's budget spent (reason: what it was for)",
    ["reason"],
)
POSTPONED.labels("next_occurrence")
RETENTION_DELETED = Counter(
    "timer_retention_deleted_total", "Reached, Expired and Cancelled timers deleted after TIMER_RETENTION"
)
CLAIM_SECONDS = Histogram("timer_claim_seconds", "Time of one claim statement", buckets=_LATENCY_BUCKETS)
PUBLISH_SECONDS = Histogram(
    "timer_publish_seconds",
    "Time to publish one claimed batch until its last PubAck",
    buckets=_LATENCY_BUCKETS,
)
LATENESS_SECONDS = Histogram(
    "timer_lateness_seconds", "PubAck time minus dueAt, on the database clock", buckets=_LATENESS_BUCKETS
)

LOOP_TICK = Gauge("timer_loop_last_tick_timestamp_seconds", "Last time each loop made progress", ["loop"])
# Overdue counts stop here, so a huge backlog stays cheap to measure.
OVERDUE_CAP = 100_000
OVERDUE = Gauge("timer_overdue", f"Unclaimed occurrences past their dueAt (counted up to {OVERDUE_CAP:,})")
# Paused timers are in neither timer_overdue nor timer_scheduled_estimate.
PAUSED = Gauge("timer_paused", f"Paused timers (counted up to {OVERDUE_CAP:,})")
PAUSED_TENANTS = Gauge("timer_paused_tenants", "Tenants paused as a whole")
SCHEDULED = Gauge("timer_scheduled_estimate", "Scheduled timers, the planner's estimate (fleet-wide)")
OLDEST_OVERDUE_SECONDS = Gauge(
    "timer_oldest_overdue_seconds", "Age of the oldest unclaimed overdue occurrence"
)
DB_POOL = Gauge(
    "timer_db_pool_connections", "Postgres pool connections: size (open), available (idle)", ["state"]
)
DB_POOL_WAITING = Gauge("timer_db_pool_requests_waiting", "Requests queued for a Postgres pool connection")
DB_OLDEST_WRITE = Gauge(
    "timer_db_oldest_write_seconds",
    "Age of the oldest write transaction in flight (an intake batch, a record), COMMIT included",
)
READY = Gauge("timer_ready", "1 when Postgres and NATS are reachable")
BUILD_INFO = Gauge("timer_build_info", "Always 1; the labels say which build runs", ["version", "python"])
BUILD_INFO.labels(__version__, platform.python_version()).set(1)

_last_tick: dict[str, float] = {}


def tick(loop: str) -> None:
    """A loop made progress: for the alert and /healthz."""
    now = time.time()
    _last_tick[loop] = now
    LOOP_TICK.labels(loop).set(now)


def last_tick(loop: str) -> float | None:
    return _last_tick.get(loop)


def inc_many(counter: Counter, counts: collections.Counter[tuple[str, ...]]) -> None:
    """Add a batch's counts, one labels() call per label set, and clear `counts`."""
    for labels, n in counts.items():
        counter.labels(*labels).inc(n)
    counts.clear()


def observe_many(histogram: Histogram, amounts: Sequence[float]) -> None:
    """`histogram.observe` for each amount, at the cost of one, through prometheus_client's
    internals; without them, one by one."""
    if not amounts:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for amount in amounts:
            histogram.observe(amount)
        return
    counts = [0] * len(bounds)
    for amount in amounts:
        counts[bisect.bisect_left(bounds, amount)] += 1  # the first bound >= amount, as observe
    for i, n in enumerate(counts):
        if n:
            buckets[i].inc(n)
    total.inc(math.fsum(amounts))
