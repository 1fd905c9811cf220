-- migration: no-transaction
-- Issue 23: pause and resume a tenant, or one timer (README, Pause and resume).
--
-- A paused timer is stored in an internal state, Paused, which the read model and the contract show
-- as state Scheduled with paused: true. Paused rows are not in the due index (timers_due WHERE state =
-- 'Scheduled'), so claim_due does not see them and needs no change: a big paused tenant costs no
-- claim anything, and a fleet that pauses nothing claims exactly as before.
-- Each statement stands alone (no transaction, for the index below) and can run again: the runner
-- retries a file whose index build waited too long.

-- The state check admits Paused. NOT VALID: no scan under the ALTER's brief ACCESS EXCLUSIVE lock (the
-- runner waits for it a short lock_timeout at a time); new writes are checked at once. Dropped and
-- added in one statement, so no moment lets an unknown state in, and a second run does the same.
ALTER TABLE timers DROP CONSTRAINT IF EXISTS timers_state_check,
    ADD CONSTRAINT timers_state_check CHECK (state IN ('Scheduled', 'Paused', 'Reached', 'Cancelled')) NOT VALID;
-- Every row written so far holds one of the three old states, so this only records that: a scan
-- under SHARE UPDATE EXCLUSIVE, which no claim, record or command waits for.
ALTER TABLE timers VALIDATE CONSTRAINT timers_state_check;

-- paused_at: this timer itself was paused (pause with a serviceCallId), and when. A tenant's resume
-- leaves such a timer paused; only its own resume (or a cancel) ends it. NULL on every other row:
-- a nullable column without a default, a catalog change, no rewrite.
ALTER TABLE timers ADD COLUMN IF NOT EXISTS paused_at timestamptz;

-- Tenants paused as a whole (paused_at, since when) or resumed (paused_at NULL), with the place in the
-- command stream of the pause or resume that set it: as for a timer (upsert_schedules), a command
-- earlier in the stream than the last one applied is older and changes nothing, so two replicas
-- taking a pause and a resume side by side, or a redelivered copy, cannot undo a newer one. Intake
-- reads this (tiny) table once per upsert statement: a new or rescheduled timer of a paused tenant is
-- stored Paused. A new table: no lock on anything the old release uses.
CREATE TABLE IF NOT EXISTS paused_tenants (
    tenant_id         text PRIMARY KEY,
    paused_at         timestamptz,
    command_seq       bigint,
    command_stored_at timestamptz
);

-- Paused rows by tenant: resume walks a tenant's paused rows, and `status`, the console and the
-- timer_paused gauge count them, without reading anything else. Partial: every other row (and every
-- claim, record and command that leaves a row unpaused) costs nothing here; state already decides HOT
-- updates (it is in timers_due's predicate), so no update stops being HOT.
DROP INDEX CONCURRENTLY IF EXISTS timers_paused;
CREATE INDEX CONCURRENTLY timers_paused ON timers (tenant_id, service_call_id) WHERE state = 'Paused';
