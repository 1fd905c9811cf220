"""The service's core: the loops, the ports they take and the domain types those speak. It imports no
adapter, no operator tool, neither the database driver nor nats-py (tests/unit/test_layout.py).

domain.py       the types the ports speak: Key, ClaimParams, Claimed, Fired, Failed, Outcome
ports.py        what the loops take from the outside world, as small Protocols
received.py     a delivered command or `get` as the core reads it, and how a command is answered
loop.py         what each loop is built from: settings, store, broker, wake-up, clock
firing.py       FiringLoop: claim due occurrences, two lanes, PIPELINE_DEPTH batches in flight
publishing.py   BatchFiring: a claimed batch published as each occurrence comes due, then recorded
fireable.py     which of a batch's rows can fire and each one's next occurrence, under budgets
budget.py       a budget of event-loop time for work whose amount a tenant chooses
recurrence.py   recurring timers: a period or a cron expression, when occurrence k is due
window.py       a firing window: the instant in it each occurrence fires at
expiry.py       occurrences not fired: too late (expireAfter), or missed and skipped
wakeup.py       when the firing loop should next look at the database
clock.py        the replica's estimate of the database clock: never ahead, so never early
intake.py       commands in: pulled, validated, committed in batches, then acknowledged
lane.py         the bulk lane: commands on many timers, a step at a time, tenants in turn
bulk.py         bulk actions: every timer a label selector names, a chunk at a time
ordering.py     a timer's commands apply in stream order: the decision, on plain values
commands.py     the validation boundary: bytes in, a typed command or a Rejection out
fields.py       the field checks of that boundary
headers.py      the headers a timer carries from its ScheduleTimer to its events
eventsize.py    the most a DueTimeReached weighs: the bound the start-up stream check holds
quota.py        the per-tenant limit on pending timers
readmodel.py    the `get` request/reply, tenant-scoped
timers.py       StoredTimer, a timer as the read port returns it, and its contract view
retention.py    the cleanup of finished timers past TIMER_RETENTION
waiting.py      how a loop waits: for a stop or a timeout, and between a write's attempts
crashpoints.py  the chaos suite's crash points (off unless TIMER_TEST_CRASH)"""
