"""The service's core: the loops, the ports they take and the domain types those speak. It imports no
adapter, nor the database driver or nats-py (tests/unit/test_layout.py).

domain.py       the types the ports speak
ports.py        what the loops take from the outside world, as Protocols
received.py     a delivered command or `get` as the core reads it
loop.py         what each loop is built from
firing.py       FiringLoop: claim due occurrences, two lanes, batches in flight
publishing.py   BatchFiring: a claimed batch published as each comes due, then recorded
fireable.py     which of a batch's rows can fire, and their next occurrences
budget.py       event-loop time for work whose amount a tenant chooses
recurrence.py   recurring timers: when occurrence k is due
window.py       a firing window: the instant each occurrence fires at
expiry.py       occurrences not fired: expired, or missed and skipped
wakeup.py       when the firing loop should next look at the database
clock.py        the replica's estimate of the database clock
intake.py       commands in: validated, committed in batches, then acknowledged
lane.py         the bulk lane: commands on many timers, tenants in turn
bulk.py         bulk actions by label selector, a chunk at a time
ordering.py     a timer's commands apply in stream order
commands.py     the validation boundary: bytes in, a command or a Rejection out
fields.py       the field checks of that boundary
headers.py      the headers a timer carries to its events
eventsize.py    the most a DueTimeReached weighs
quota.py        the per-tenant limit on pending timers
readmodel.py    the `get` request/reply, tenant-scoped
timers.py       StoredTimer and its contract view
retention.py    the cleanup of finished timers
waiting.py      how a loop waits
crashpoints.py  the chaos suite's crash points"""
