-- Per-timer order of commands without timestampMs (README, "Commands behind a stuck occurrence").
-- command_seq: the command stream's sequence of the last command applied to the timer.
-- deferred_seqs: the stream sequences, ascending, of the commands waiting for this timer (deferred
-- behind its claimed occurrence, or behind an older waiting command): a later command applies
-- only once every older one has. NULL, as on every timer stored before these columns, when none
-- waits. Nullable columns without a default: a catalog change, no rewrite; their brief ACCESS
-- EXCLUSIVE lock is waited for by the runner a short lock_timeout at a time (README, Upgrades).
ALTER TABLE timers ADD COLUMN command_seq bigint;
ALTER TABLE timers ADD COLUMN deferred_seqs bigint[];
