-- migration: no-transaction
-- Issue 23 (review): retention no longer reads past paused rows.
--
-- timers_finished (0001: WHERE state <> 'Scheduled') also holds Paused rows (0011), ordered by
-- updated_at: once a pause outlasts TIMER_RETENTION they sit at the head of that order, and every
-- delete_finished batch walked (and read the heap of) all of them before finding the rows it may
-- delete. Its replacement holds finished rows only. Its predicate is the very one delete_finished
-- already states (since 0011), so replicas of the release before this one use it too while the
-- rollout runs. Built before the old one goes, so retention never runs without an index.
-- Each statement stands alone (no transaction, for CONCURRENTLY) and can run again: a half-built
-- index of the same name is dropped first.
DROP INDEX CONCURRENTLY IF EXISTS timers_done;
CREATE INDEX CONCURRENTLY timers_done ON timers (updated_at) WHERE state <> 'Scheduled' AND state <> 'Paused';
DROP INDEX CONCURRENTLY IF EXISTS timers_finished;
