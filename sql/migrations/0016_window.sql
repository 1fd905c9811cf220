-- Issue 35: a firing window (README, Firing window).
-- fire_window: the ScheduleTimer's `window`, the ISO 8601 duration as given; NULL without one.
-- nominal_due_at: with a window, the current occurrence's dueAt, while due_at holds the instant
-- it is planned to fire at (worker/core/window.py): due_at stays the claim key, so the claim
-- keeps walking the due index (timers_due) and nothing it plans changes. NULL without a window,
-- where due_at is both, as on every timer stored before these columns.
-- Nullable columns without a default: a catalog change, no rewrite (as 0009). Replicas of the
-- release before ignore them: one that claims a timer with a window fires it at its planned
-- instant with that as its dueAt (README, Upgrades: finish the rollout before sending windows).
ALTER TABLE timers ADD COLUMN fire_window text;
ALTER TABLE timers ADD COLUMN nominal_due_at timestamptz;
