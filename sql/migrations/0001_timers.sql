-- The timer table: the source of truth. One row per (tenant_id, service_call_id).
CREATE TABLE timers (
    tenant_id        text        NOT NULL,
    service_call_id  text        NOT NULL,
    state            text        NOT NULL CHECK (state IN ('Scheduled', 'Reached', 'Cancelled')),
    -- NULL only for a cancel that arrived before any schedule (a tombstone that keeps ordering).
    due_at           timestamptz CHECK (due_at IS NOT NULL OR state = 'Cancelled'),
    registered_at    timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    reached_at       timestamptz,
    correlation_id   text,
    -- timestampMs of the newest command applied; an older command never overwrites it.
    command_ts       bigint,
    -- The lease: who claimed the current occurrence, the fencing token, and until when (DB clock).
    -- lease_expires_at stays set after expiry: "claimed" means the occurrence will fire.
    lease_owner      text,
    lease_token      bigint,
    lease_expires_at timestamptz,
    attempts         integer     NOT NULL DEFAULT 0,
    last_error       text,
    -- Recurrence: ISO 8601 period, total occurrences (NULL = forever), IANA zone.
    repeat_every     text,
    repeat_times     integer,
    repeat_timezone  text,
    -- The dueAt of the ScheduleTimer that defined this timer: occurrences count from it, and a
    -- redelivered copy of that same command is recognised and changes nothing.
    anchor_due_at    timestamptz,
    occurrence_index integer     NOT NULL DEFAULT 0,  -- index of due_at counted from the anchor
    fired_count      integer     NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, service_call_id)
) WITH (fillfactor = 80);  -- room on each page for HOT updates of the lease columns

-- Fencing tokens: strictly increasing across the fleet.
CREATE SEQUENCE timer_lease_token AS bigint CACHE 100;

-- The due scan reads only Scheduled rows, so Reached/Cancelled rows never slow it down.
CREATE INDEX timers_due ON timers (due_at) WHERE state = 'Scheduled';

-- Retention sweeps finished rows oldest first.
CREATE INDEX timers_finished ON timers (updated_at) WHERE state <> 'Scheduled';

-- A high-churn queue table: vacuum it early and often.
ALTER TABLE timers SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);
