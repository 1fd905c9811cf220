-- Intake: a batch of commands applied in one transaction, in stream order per timer (adapters/postgres/store.py, Store.apply).
-- The why of each statement: docs/SQL.md.

-- name: lock_keys
-- Lock the batch's existing rows; return those a claim's batch in flight holds, and whether it may fire them.
WITH shared AS MATERIALIZED (
    SELECT t.tenant_id, t.service_call_id, t.state, t.due_at, t.lease_expires_at
    FROM (SELECT DISTINCT tenant_id, service_call_id
          FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[]) AS k(tenant_id, service_call_id)
          ORDER BY tenant_id, service_call_id) AS k
    JOIN timers t ON t.tenant_id = k.tenant_id AND t.service_call_id = k.service_call_id
    ORDER BY t.tenant_id, t.service_call_id
    FOR KEY SHARE OF t
),
locked AS MATERIALIZED (
    SELECT t.tenant_id, t.service_call_id
    FROM shared s JOIN timers t ON t.tenant_id = s.tenant_id AND t.service_call_id = s.service_call_id
    FOR UPDATE OF t SKIP LOCKED
)
SELECT s.tenant_id, s.service_call_id,
       coalesce(s.state = 'Scheduled' AND s.due_at <= clock_timestamp() + %(reach)s::interval
                AND (s.lease_expires_at IS NULL OR s.lease_expires_at < clock_timestamp()), true) AS claimable
FROM shared s
WHERE NOT EXISTS (SELECT FROM locked l
                  WHERE l.tenant_id = s.tenant_id AND l.service_call_id = s.service_call_id);

-- fragment: command_in_order
-- A command may change the timer: not Reached nor Expired, not claimed, not older (timestampMs, then stream
-- position), not behind a command waiting for the timer (deferred_seqs) unless that marker is stale.
t.state NOT IN ('Reached', 'Expired')
  AND t.lease_expires_at IS NULL
  AND (excluded.command_ts IS NULL OR t.command_ts IS NULL OR excluded.command_ts >= t.command_ts)
  AND ((excluded.command_ts IS NOT NULL AND t.command_ts IS NOT NULL)
       OR excluded.command_seq IS NULL OR t.command_seq IS NULL OR t.command_stored_at IS NULL
       OR excluded.command_seq >= t.command_seq OR excluded.command_stored_at > t.command_stored_at)
  AND (t.deferred_seqs IS NULL OR excluded.command_seq IS NULL OR excluded.command_seq <= t.deferred_seqs[1]
       OR t.updated_at < now() - %(order_grace)s::interval)

-- fragment: command_applied_set
-- What an applied command leaves of its order: its timestampMs and stream position, and no longer
-- waiting (it leaves deferred_seqs; a stale marker goes).
    command_ts = coalesce(excluded.command_ts, t.command_ts),
    command_seq = coalesce(excluded.command_seq, t.command_seq),
    command_stored_at = coalesce(excluded.command_stored_at, t.command_stored_at),
    deferred_seqs = CASE WHEN t.updated_at >= now() - %(order_grace)s::interval
                         THEN nullif(array_remove(t.deferred_seqs, excluded.command_seq), '{}') END,
    updated_at = now()

-- name: upsert_schedules
-- Insert or reschedule timers, one row per key, unless the command is older or must wait.
INSERT INTO timers AS t (tenant_id, service_call_id, state, due_at, correlation_id, command_ts,
                         repeat_every, repeat_times, repeat_timezone, anchor_due_at, carried_headers,
                         command_seq, command_stored_at, repeat_cron, repeat_until, data,
                         fire_window, nominal_due_at, expire_after, repeat_catchup, labels)
SELECT i.tenant_id, i.service_call_id,
       CASE WHEN i.tenant_id IN (SELECT p.tenant_id FROM paused_tenants p WHERE p.paused_at IS NOT NULL) THEN 'Paused' ELSE 'Scheduled' END,
       coalesce(i.planned_at, i.due_at), i.correlation_id, i.command_ts,
       i.repeat_every, i.repeat_times, i.repeat_timezone, i.due_at, i.carried_headers, i.command_seq,
       i.command_stored_at, i.repeat_cron, i.repeat_until, i.data,
       i.fire_window, CASE WHEN i.fire_window IS NOT NULL THEN i.due_at END, i.expire_after,
       i.repeat_catchup, i.labels
FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(due_at)b::timestamptz[],
            %(correlation_id)b::text[], %(command_ts)b::bigint[], %(repeat_every)b::text[],
            %(repeat_times)b::int[], %(repeat_timezone)b::text[], %(carried_headers)b::jsonb[],
            %(command_seq)b::bigint[], %(command_stored_at)b::timestamptz[], %(repeat_cron)b::text[],
            %(repeat_until)b::timestamptz[], %(data)b::jsonb[], %(fire_window)b::text[],
            %(planned_at)b::timestamptz[], %(expire_after)b::text[], %(repeat_catchup)b::text[],
            %(labels)b::jsonb[])
     AS i(tenant_id, service_call_id, due_at, correlation_id, command_ts, repeat_every,
          repeat_times, repeat_timezone, carried_headers, command_seq, command_stored_at,
          repeat_cron, repeat_until, data, fire_window, planned_at, expire_after, repeat_catchup,
          labels)
ON CONFLICT (tenant_id, service_call_id) DO UPDATE SET
    state = CASE WHEN t.paused_at IS NOT NULL THEN 'Paused' ELSE excluded.state END,
    -- A restatement keeps the timer's progress; anything else starts it afresh.
    (due_at, occurrence_index, claimed_at, nominal_due_at) = (
        SELECT CASE WHEN r.same THEN t.due_at ELSE excluded.due_at END,
               CASE WHEN r.same THEN t.occurrence_index ELSE 0 END,
               CASE WHEN r.same THEN t.claimed_at END,
               CASE WHEN r.same THEN t.nominal_due_at ELSE excluded.nominal_due_at END
        FROM (SELECT t.state IN ('Scheduled', 'Paused')
                     AND (t.anchor_due_at, t.repeat_every, t.repeat_times, t.repeat_timezone,
                          t.repeat_cron, t.repeat_until, t.fire_window)
                         IS NOT DISTINCT FROM (excluded.anchor_due_at, excluded.repeat_every,
                                               excluded.repeat_times, excluded.repeat_timezone,
                                               excluded.repeat_cron, excluded.repeat_until,
                                               excluded.fire_window)
                     AS same) AS r),
    anchor_due_at = excluded.anchor_due_at,
    fire_window = excluded.fire_window,
    expire_after = excluded.expire_after,
    repeat_catchup = excluded.repeat_catchup,
    correlation_id = excluded.correlation_id,
    carried_headers = excluded.carried_headers,
    repeat_every = excluded.repeat_every,
    repeat_times = excluded.repeat_times,
    repeat_timezone = excluded.repeat_timezone,
    repeat_cron = excluded.repeat_cron,
    repeat_until = excluded.repeat_until,
    data = excluded.data,
    labels = excluded.labels,
    attempts = 0,
    last_error = NULL,
    lease_owner = NULL,
    lease_token = NULL,
{{command_applied_set}}
WHERE {{command_in_order}}
  AND NOT (t.state = CASE WHEN t.paused_at IS NOT NULL THEN 'Paused' ELSE excluded.state END
           AND (t.anchor_due_at, t.repeat_every, t.repeat_times, t.repeat_timezone, t.correlation_id,
                t.carried_headers, t.command_ts, t.command_seq, t.command_stored_at, t.repeat_cron,
                t.repeat_until, t.data, t.fire_window, t.expire_after, t.repeat_catchup, t.labels)
               IS NOT DISTINCT FROM (excluded.anchor_due_at, excluded.repeat_every, excluded.repeat_times,
                                     excluded.repeat_timezone, excluded.correlation_id,
                                     excluded.carried_headers,
                                     coalesce(excluded.command_ts, t.command_ts),
                                     coalesce(excluded.command_seq, t.command_seq),
                                     coalesce(excluded.command_stored_at, t.command_stored_at),
                                     excluded.repeat_cron, excluded.repeat_until, excluded.data,
                                     excluded.fire_window, excluded.expire_after,
                                     excluded.repeat_catchup, excluded.labels))
RETURNING t.tenant_id, t.service_call_id, t.due_at;

-- name: cancel_timers
-- Cancel timers (a tombstone for an unknown key), unless the command is older or must wait.
INSERT INTO timers AS t (tenant_id, service_call_id, state, due_at, correlation_id, command_ts, command_seq,
                         command_stored_at)
SELECT i.tenant_id, i.service_call_id, 'Cancelled', NULL, i.correlation_id, i.command_ts, i.command_seq,
       i.command_stored_at
FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(correlation_id)b::text[],
            %(command_ts)b::bigint[], %(command_seq)b::bigint[], %(command_stored_at)b::timestamptz[])
     AS i(tenant_id, service_call_id, correlation_id, command_ts, command_seq, command_stored_at)
ON CONFLICT (tenant_id, service_call_id) DO UPDATE SET
    state = 'Cancelled',
    paused_at = NULL,
    control_seq = CASE WHEN excluded.command_seq IS NULL THEN t.control_seq ELSE excluded.command_seq END,
    control_stored_at = CASE WHEN excluded.command_seq IS NULL THEN t.control_stored_at
                             ELSE excluded.command_stored_at END,
{{command_applied_set}}
WHERE {{command_in_order}}
RETURNING t.tenant_id, t.service_call_id, NULL::timestamptz AS due_at;

-- name: held_among
-- Of keys the writes left alone, why their commands may wait (claimed, stuck, behind a waiting one).
SELECT tenant_id, service_call_id,
       state = 'Scheduled' AND lease_expires_at IS NOT NULL AS claimed,
       coalesce(claimed_at < now() - %(stuck_after)s::interval, false) AS stuck,
       CASE WHEN updated_at >= now() - %(order_grace)s::interval THEN deferred_seqs[1] END AS head,
       deferred_seqs IS NOT NULL AS marked,
       CASE WHEN state = 'Scheduled' AND (lease_expires_at IS NULL OR lease_expires_at < now())
            THEN due_at END AS due_at
FROM (SELECT t.tenant_id, t.service_call_id, t.state, t.lease_expires_at, t.claimed_at,
             t.updated_at, t.deferred_seqs, t.due_at
      FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[]) AS k(tenant_id, service_call_id)
      JOIN timers t ON t.tenant_id = k.tenant_id AND t.service_call_id = k.service_call_id
      OFFSET 0) AS t
WHERE t.state = 'Scheduled' OR t.deferred_seqs IS NOT NULL;

-- name: update_deferred_seqs
-- Add or remove commands' stream sequences in deferred_seqs, the commands waiting for their timer.
WITH c AS (
    SELECT tenant_id, service_call_id,
           array_agg(seq) FILTER (WHERE waits) AS adds,
           array_agg(seq) FILTER (WHERE NOT waits) AS drops
    FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(seq)b::bigint[], %(waits)b::bool[])
         AS c(tenant_id, service_call_id, seq, waits)
    GROUP BY tenant_id, service_call_id
)
UPDATE timers t SET deferred_seqs = (
    SELECT array_agg(DISTINCT s ORDER BY s)
    FROM unnest(CASE WHEN (t.state = 'Scheduled' AND t.lease_expires_at IS NOT NULL)
                          OR t.updated_at >= now() - %(order_grace)s::interval
                     THEN t.deferred_seqs END || coalesce(c.adds, '{}')) AS s
    WHERE s <> ALL (coalesce(c.drops, '{}')))
FROM c
WHERE t.tenant_id = c.tenant_id AND t.service_call_id = c.service_call_id;

-- name: lock_tenants_shared
-- Hold the batch's tenants, shared, against a pause or resume until the transaction ends.
SELECT count(pg_advisory_xact_lock_shared(k)) AS n
FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS u(k, i);
