-- Firing: a claim's transaction from claim_due to record_fired or retry_later (adapters/postgres/claim.py).
-- The why of each statement: docs/SQL.md.

-- name: claim_begin
-- Begin a claim's transaction with the plan settings that keep claim_due on the due index.
BEGIN;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_sort = off;

-- fragment: recorded_at_claim
-- A one-shot occurrence whose row holds nothing retry_later could not put back, nor may expire: claim_due records it.
(num_nonnulls(t.repeat_every, t.repeat_cron) = 0 OR t.anchor_due_at IS NULL)
AND num_nonnulls(t.paused_at, t.reached_at, t.last_error, t.deferred_seqs, t.expire_after) = 0

-- name: claim_due
-- Claim due occurrences under a lease (a one-shot recorded as fired at once); say when the next is due.
WITH
oldest AS MATERIALIZED (
    SELECT ctid FROM timers
    WHERE state = 'Scheduled' AND due_at <= now() + %(ahead_ms)s * interval '1 millisecond'
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY due_at
    LIMIT %(oldest_limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
newest AS MATERIALIZED (
    SELECT ctid FROM timers
    WHERE state = 'Scheduled' AND due_at <= now() + %(ahead_ms)s * interval '1 millisecond'
      AND due_at > now() - %(fresh_window_ms)s * interval '1 millisecond'
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY due_at DESC
    LIMIT %(fresh_limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
token AS MATERIALIZED (
    SELECT nextval('timer_lease_token') AS lease_token
),
claimed AS (
    UPDATE timers t SET
        state = CASE WHEN {{recorded_at_claim}} THEN 'Reached' ELSE t.state END,
        fired_count = CASE WHEN {{recorded_at_claim}} THEN least(t.fired_count, 2147483646) + 1 ELSE t.fired_count END,
        reached_at = CASE WHEN {{recorded_at_claim}} THEN greatest(t.due_at, statement_timestamp()) ELSE t.reached_at END,
        updated_at = CASE WHEN {{recorded_at_claim}} THEN greatest(t.due_at, statement_timestamp()) ELSE t.updated_at END,
        lease_owner = CASE WHEN {{recorded_at_claim}} THEN NULL ELSE %(owner)s END,
        lease_token = token.lease_token,
        lease_expires_at = CASE WHEN {{recorded_at_claim}} THEN NULL ELSE now() + %(lease_ms)s * interval '1 millisecond' END,
        -- Saturates: `+ 1` past integer's maximum would fail the whole claim, one row stopping the fleet.
        attempts = least(t.attempts, 2147483646) + 1,
        -- A recurring timer's next occurrence is the first due after this (worker/core/recurrence.py).
        -- Downtime is the only reason to skip one: the timer sat claimable and unclaimed for
        -- %(downtime_ms)s (since it came due, its lease ran out, or record_fired carried the
        -- reference to it), and then the reference is now, so the missed window fires once.
        -- Otherwise the fleet was claiming (a crash, a poll interval's wait): a re-claim or a
        -- carried reference is kept, and a fresh occurrence counts from its own dueAt, so
        -- whatever came due meanwhile still fires, late and in order.
        -- repeat.catchup "all" (0016) skips nothing: every missed occurrence fires, oldest first, up
        -- to %(catchup_max)s in a row (caught_up); past that, the reference is now, as after downtime.
        claimed_at = CASE
            WHEN t.repeat_catchup = 'all'
                THEN CASE WHEN coalesce(t.caught_up, 0) < %(catchup_max)s
                          THEN coalesce(t.claimed_at, least(coalesce(t.nominal_due_at, t.due_at), now()))
                          ELSE now() END
            WHEN t.claimed_at IS NULL AND t.due_at >= now() - %(downtime_ms)s * interval '1 millisecond'
                THEN least(coalesce(t.nominal_due_at, t.due_at), now())
            WHEN t.claimed_at IS NOT NULL AND greatest(t.lease_expires_at, t.updated_at)
                                              >= now() - %(downtime_ms)s * interval '1 millisecond'
                THEN t.claimed_at
            ELSE now() END
    FROM token
    WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM oldest UNION SELECT ctid FROM newest))
    RETURNING t.tenant_id, t.service_call_id, t.due_at, t.correlation_id, t.lease_token,
              t.attempts, t.state = 'Reached' AS recorded, t.repeat_every, t.repeat_times,
              t.repeat_timezone, t.anchor_due_at, t.occurrence_index, t.claimed_at AS recurrence_ref,
              t.ctid::text AS row_id, t.carried_headers AS carried,
              -- 0009: the cron schedule, the end, and `data` as text (spliced into the event).
              t.repeat_cron, t.repeat_until, t.data::text AS data,
              -- 0016: a firing window; due_at is then the planned instant, nominal_due_at the dueAt.
              t.nominal_due_at, t.fire_window, t.expire_after, t.repeat_catchup, t.caught_up,
              -- 0017: the labels as text (spliced into the event).
              t.labels::text AS labels
)
SELECT c.*, n.next_due_at, clock_timestamp() AS db_now
FROM (SELECT min(due_at) AS next_due_at FROM timers
      WHERE state = 'Scheduled' AND due_at > now() + %(ahead_ms)s * interval '1 millisecond') n
LEFT JOIN claimed c ON true;

-- name: decide_expiry
-- Record whether each occurrence expires, unless decided before (that decision stands); answer those that expire.
INSERT INTO timer_expiry AS e (tenant_id, service_call_id, due_at, expired)
SELECT * FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(due_at)b::timestamptz[],
                     %(expired)b::bool[])
ON CONFLICT (tenant_id, service_call_id, due_at) DO UPDATE SET expired = e.expired
RETURNING e.tenant_id, e.service_call_id, e.expired;

-- fragment: record_fired_set
-- What recording a firing writes: the next occurrence (with a window: its planned instant in due_at,
-- its dueAt in nominal_due_at), or Reached. f.recurrence_ref and f.attempts:
-- the claim's, when its transaction was lost (record_fired_again); NULL, the row's own, in it.
    state = CASE WHEN f.next_due_at IS NULL THEN CASE WHEN f.unfired THEN 'Expired' ELSE 'Reached' END
                 WHEN t.paused_at IS NOT NULL
                   OR t.tenant_id IN (SELECT p.tenant_id FROM paused_tenants p WHERE p.paused_at IS NOT NULL)
                 THEN 'Paused' ELSE 'Scheduled' END,
    paused_at = CASE WHEN f.next_due_at IS NOT NULL THEN t.paused_at END,
    due_at = coalesce(f.next_due_at, t.due_at),
    nominal_due_at = CASE WHEN f.next_due_at IS NOT NULL THEN f.next_nominal ELSE t.nominal_due_at END,
    occurrence_index = coalesce(f.next_index, t.occurrence_index),
    fired_count = least(t.fired_count, 2147483646) + CASE WHEN f.unfired THEN 0 ELSE 1 END,
    reached_at = CASE WHEN f.unfired THEN t.reached_at ELSE f.db_now END,
    updated_at = f.db_now,
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = CASE WHEN f.next_due_at IS NULL THEN coalesce(f.attempts, t.attempts) ELSE 0 END,
    claimed_at = CASE WHEN f.next_due_at <= f.db_now THEN coalesce(f.recurrence_ref, t.claimed_at) END,
    caught_up = CASE WHEN t.repeat_catchup = 'all' AND f.next_due_at <= f.db_now
                     THEN least(coalesce(t.caught_up, 0), 2147483646) + 1 END,
    last_error = NULL

-- name: record_fired
-- Record acknowledged firings in the claim's own transaction, fenced by its row locks and token.
WITH f AS MATERIALIZED (
    SELECT f.*, f.row_id::tid AS tid, statement_timestamp() AS db_now,
           NULL::timestamptz AS recurrence_ref, NULL::int AS attempts  -- the row's own (record_fired_set)
    FROM unnest(%(row_id)b::text[], %(lease_token)b::bigint[], %(due_at)b::timestamptz[],
                %(next_due_at)b::timestamptz[], %(next_index)b::int[], %(next_nominal)b::timestamptz[],
                %(unfired)b::bool[])
         AS f(row_id, lease_token, due_at, next_due_at, next_index, next_nominal, unfired)
)
UPDATE timers t SET
{{record_fired_set}}
FROM f
WHERE t.ctid = ANY (ARRAY(SELECT tid FROM f))
  AND t.ctid = f.tid
  AND t.lease_token = f.lease_token
  AND t.due_at = f.due_at;

-- name: record_fired_again
-- Record again, in a transaction of its own, firings whose claim's transaction was lost.
WITH f AS MATERIALIZED (
    SELECT f.*, statement_timestamp() AS db_now
    FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(due_at)b::timestamptz[],
                %(occurrence_index)b::int[], %(anchor_due_at)b::timestamptz[], %(repeat_every)b::text[],
                %(repeat_times)b::int[], %(repeat_timezone)b::text[], %(repeat_cron)b::text[],
                %(repeat_until)b::timestamptz[], %(recurrence_ref)b::timestamptz[],
                %(next_due_at)b::timestamptz[], %(next_index)b::int[], %(attempts)b::int[],
                %(next_nominal)b::timestamptz[], %(fire_window)b::text[], %(unfired)b::bool[])
         AS f(tenant_id, service_call_id, due_at, occurrence_index, anchor_due_at, repeat_every,
              repeat_times, repeat_timezone, repeat_cron, repeat_until, recurrence_ref,
              next_due_at, next_index, attempts, next_nominal, fire_window, unfired)
),
-- The published occurrence, still as it was, and not locked by anyone else.
still AS MATERIALIZED (
    SELECT t.tenant_id, t.service_call_id
    FROM timers t JOIN f ON (t.tenant_id, t.service_call_id) = (f.tenant_id, f.service_call_id)
    WHERE t.state = 'Scheduled'
      AND t.due_at = f.due_at
      AND t.occurrence_index = f.occurrence_index
      AND t.anchor_due_at IS NOT DISTINCT FROM f.anchor_due_at
      AND t.repeat_every IS NOT DISTINCT FROM f.repeat_every
      AND t.repeat_times IS NOT DISTINCT FROM f.repeat_times
      AND t.repeat_timezone IS NOT DISTINCT FROM f.repeat_timezone
      AND t.repeat_cron IS NOT DISTINCT FROM f.repeat_cron
      AND t.repeat_until IS NOT DISTINCT FROM f.repeat_until
      AND t.fire_window IS NOT DISTINCT FROM f.fire_window
      AND (t.lease_expires_at IS NULL OR t.lease_expires_at < f.db_now)
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE timers t SET
{{record_fired_set}}
FROM still JOIN f ON (still.tenant_id, still.service_call_id) = (f.tenant_id, f.service_call_id)
WHERE (t.tenant_id, t.service_call_id) = (still.tenant_id, still.service_call_id);

-- name: retry_later
-- Put claimed occurrences back, leased, for a retry after a back-off (or a stop's hold).
WITH f AS MATERIALIZED (
    SELECT f.*, f.row_id::tid AS tid
    FROM unnest(%(row_id)b::text[], %(lease_token)b::bigint[], %(error)b::text[], %(backoff_ms)b::bigint[])
         AS f(row_id, lease_token, error, backoff_ms)
)
UPDATE timers t SET
    state = 'Scheduled',
    fired_count = CASE WHEN t.state = 'Reached' THEN t.fired_count - 1 ELSE t.fired_count END,
    reached_at = CASE WHEN t.state = 'Reached' THEN NULL ELSE t.reached_at END,
    updated_at = CASE WHEN t.state = 'Reached' THEN now() ELSE t.updated_at END,
    lease_owner = %(owner)s::text,
    lease_expires_at = CASE WHEN %(owner)s::text IS NULL THEN statement_timestamp() ELSE now() END
                       + f.backoff_ms * interval '1 millisecond',
    last_error = coalesce(f.error, t.last_error)
FROM f
WHERE t.ctid = ANY (ARRAY(SELECT tid FROM f))
  AND t.ctid = f.tid
  AND t.lease_token = f.lease_token;
