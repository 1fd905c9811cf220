-- Issue 23: cron schedules, an end to any schedule, and a payload delivered with every firing.
-- repeat_cron: a five-field cron expression, set instead of repeat_every (worker/core/recurrence.py).
-- repeat_until: no occurrence after this instant, for either kind.
-- data: the ScheduleTimer's opaque JSON `data` (at most TIMER_MAX_PAYLOAD_BYTES), put into each of
-- its DueTimeReached events; NULL, as on every timer stored before these columns, when it has none,
-- which costs a timer nothing but its bit in the row's null bitmap.
-- Nullable columns without a default: a catalog change, no rewrite; their brief ACCESS EXCLUSIVE
-- lock is waited for by the runner a short lock_timeout at a time (README, Upgrades). Replicas of
-- the release before ignore them: it never writes them, and a cron timer written by a new replica
-- has no repeat_every, so an old replica that claims it fires it once and records it Reached
-- (README, Upgrades: finish the rollout before sending cron schedules).
ALTER TABLE timers ADD COLUMN repeat_cron text;
ALTER TABLE timers ADD COLUMN repeat_until timestamptz;
ALTER TABLE timers ADD COLUMN data jsonb;
