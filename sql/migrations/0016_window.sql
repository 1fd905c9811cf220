-- migration: no-transaction
-- Issue 35: a firing window (docs/USING.md, Firing window), expiry (docs/USING.md, Expiry) and what a recurring
-- timer does with the occurrences it missed (docs/USING.md, Recurring timers, repeat.catchup).
-- Each statement stands alone (no transaction: the state check's VALIDATE below must not scan
-- under the lock its ALTER takes) and can run again.

-- fire_window: the ScheduleTimer's `window`, the ISO 8601 duration as given; NULL without one.
-- nominal_due_at: with a window, the current occurrence's dueAt, while due_at holds the instant
-- it is planned to fire at (worker/core/window.py): due_at stays the claim key, so the claim
-- keeps walking the due index (timers_due) and nothing it plans changes. NULL without a window,
-- where due_at is both, as on every timer stored before these columns.
-- expire_after: the ScheduleTimer's `expireAfter`, as given; NULL without one.
-- repeat_catchup: its `repeat.catchup` as given, NULL when absent ("one", as before).
-- caught_up: for a timer whose repeat.catchup is "all", how many missed occurrences in a row it
-- has fired since it fell behind (record_fired_set); NULL once it is on time, as on every other.
-- Nullable columns without a default: a catalog change, no rewrite (as 0009). Replicas of the
-- release before ignore them (docs/UPGRADING.md: finish the rollout before sending any).
ALTER TABLE timers ADD COLUMN IF NOT EXISTS fire_window text;
ALTER TABLE timers ADD COLUMN IF NOT EXISTS nominal_due_at timestamptz;
ALTER TABLE timers ADD COLUMN IF NOT EXISTS expire_after text;
ALTER TABLE timers ADD COLUMN IF NOT EXISTS repeat_catchup text;
ALTER TABLE timers ADD COLUMN IF NOT EXISTS caught_up integer;

-- The state check admits Expired: a one-shot timer whose occurrence expired unpublished, final
-- like Reached. As in 0011: NOT VALID (no scan under the ALTER's brief ACCESS EXCLUSIVE lock),
-- dropped and added in one statement, then validated under SHARE UPDATE EXCLUSIVE, which no claim,
-- record or command waits for.
ALTER TABLE timers DROP CONSTRAINT IF EXISTS timers_state_check,
    ADD CONSTRAINT timers_state_check
        CHECK (state IN ('Scheduled', 'Paused', 'Reached', 'Cancelled', 'Expired')) NOT VALID;
ALTER TABLE timers VALIDATE CONSTRAINT timers_state_check;
