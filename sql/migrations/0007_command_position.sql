-- Per-timer stream order across replicas (README, Ordering): the stored time (JetStream's
-- timestamp) of the last command applied to the timer, paired with its stream sequence
-- (command_seq, 0006). A command earlier in the stream than that one changes nothing. The time
-- tells a recreated command stream, whose sequences start again at 1, from the old one: a
-- command is older only if both its sequence and its stored time are. NULL, as on every timer
-- stored before this column (or by a release without it): no stream order to keep yet. A nullable
-- column without a default: a catalog change, no rewrite (README, Upgrades).
ALTER TABLE timers ADD COLUMN command_stored_at timestamptz;
