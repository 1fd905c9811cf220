-- A timer's own pauses and resumes apply in stream order (README, Pause and resume; review of issue
-- 23). control_seq and control_stored_at: the stream position (sequence and stored time, as
-- command_seq and command_stored_at, 0007) of the last pause or resume with this serviceCallId that
-- reached the row, applied or found nothing to do. One older than that changes nothing: a Pause
-- deferred behind a claim's batch in flight that comes back after a later Resume no longer pauses
-- the timer for good. Their own order, not command_seq: a deferred ScheduleTimer older than a Resume
-- still applies. NULL, as on every row stored before these columns (or written by a release without
-- them): no order to keep yet. Nullable columns without a default: a catalog change, no rewrite;
-- their brief ACCESS EXCLUSIVE lock is waited for by the runner a short lock_timeout at a time
-- (README, Upgrades). The release before this one never reads or writes them.
ALTER TABLE timers ADD COLUMN control_seq bigint;
ALTER TABLE timers ADD COLUMN control_stored_at timestamptz;
