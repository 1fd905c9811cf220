-- The headers a ScheduleTimer carries to each of its DueTimeReached events: W3C trace context
-- (traceparent, tracestate) and the producer headers TIMER_CARRY_HEADERS allows, as one JSON
-- object. NULL when the command carried none, as for every timer stored before this column.
-- A nullable column without a default: a catalog change, no rewrite. Its brief ACCESS EXCLUSIVE
-- lock is waited for by the runner a short lock_timeout at a time (README, Upgrades).
ALTER TABLE timers ADD COLUMN carried_headers jsonb;
