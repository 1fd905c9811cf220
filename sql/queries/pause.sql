-- Pause and resume of a tenant or one timer (adapters/postgres/pausing.py).
-- The why of each statement: docs/SQL.md.

-- name: lock_tenant
-- A tenant's pause or resume: wait for intake's transactions on the tenant, and hold new ones back.
SELECT count(pg_advisory_xact_lock(k)) AS n
FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS u(k, i);

-- name: pause_tenant
-- Record a tenant as paused or resumed, unless a later command already set it.
INSERT INTO paused_tenants AS p (tenant_id, paused_at, command_seq, command_stored_at)
VALUES (%(tenant_id)s, CASE WHEN %(pause)s THEN now() END, %(command_seq)s, %(command_stored_at)s)
ON CONFLICT (tenant_id) DO UPDATE SET
    paused_at = CASE WHEN %(pause)s THEN coalesce(p.paused_at, now()) END,
    command_seq = excluded.command_seq,
    command_stored_at = excluded.command_stored_at
WHERE excluded.command_seq IS NULL OR p.command_seq IS NULL OR p.command_stored_at IS NULL
   OR excluded.command_seq > p.command_seq OR excluded.command_stored_at > p.command_stored_at
RETURNING true AS first;

-- name: pause_tenant_rows
-- Move one chunk of a paused tenant's Scheduled, unclaimed rows to Paused.
WITH c AS MATERIALIZED (
    SELECT tenant_id, service_call_id FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id > %(after)s
      AND state = 'Scheduled' AND lease_expires_at IS NULL
      AND EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = %(tenant_id)s AND p.paused_at IS NOT NULL)
    ORDER BY service_call_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE timers t SET state = 'Paused', claimed_at = NULL, updated_at = now()
FROM c
WHERE t.tenant_id = c.tenant_id AND t.service_call_id = c.service_call_id
RETURNING t.service_call_id;

-- name: tenant_left_scheduled
-- The paused tenant's rows still Scheduled: how many, claimed, stuck.
SELECT count(*) AS n,
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL) AS claimed,
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL AND claimed_at < now() - %(stuck_after)s::interval) AS stuck
FROM timers
WHERE tenant_id = %(tenant_id)s AND state = 'Scheduled'
  AND EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = %(tenant_id)s AND p.paused_at IS NOT NULL);

-- name: resume_tenant_rows
-- Move one chunk of a resumed tenant's Paused rows back to Scheduled.
WITH c AS MATERIALIZED (
    SELECT tenant_id, service_call_id FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id > %(after)s
      AND state = 'Paused' AND paused_at IS NULL
      AND NOT EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = %(tenant_id)s AND p.paused_at IS NOT NULL)
    ORDER BY service_call_id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE timers t SET state = 'Scheduled', claimed_at = NULL, updated_at = now()
FROM c
WHERE t.tenant_id = c.tenant_id AND t.service_call_id = c.service_call_id
RETURNING t.service_call_id, t.due_at;

-- name: tenant_left_paused
-- The resumed tenant's rows still Paused that its resume should have moved.
SELECT count(*) AS n, 0 AS claimed, 0 AS stuck FROM timers
WHERE tenant_id = %(tenant_id)s AND state = 'Paused' AND paused_at IS NULL
  AND NOT EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = %(tenant_id)s AND p.paused_at IS NOT NULL);

-- name: pause_timer
-- Pause timers of one tenant by key (and selector), each in stream order among its pauses and resumes.
WITH s AS MATERIALIZED (
    SELECT service_call_id FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id = ANY (%(service_call_ids)s::text[])
      AND {{carries_selector}}
    ORDER BY service_call_id
    FOR KEY SHARE
), k AS MATERIALIZED (
    SELECT service_call_id FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id IN (SELECT service_call_id FROM s)
    ORDER BY service_call_id
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE timers t SET
        state = CASE WHEN t.state IN ('Scheduled', 'Paused') AND t.lease_expires_at IS NULL THEN 'Paused'
                     ELSE t.state END,
        paused_at = CASE WHEN t.state IN ('Scheduled', 'Paused') THEN coalesce(t.paused_at, now())
                         ELSE t.paused_at END,
        claimed_at = CASE WHEN t.state IN ('Scheduled', 'Paused') AND t.lease_expires_at IS NULL THEN NULL
                          ELSE t.claimed_at END,
        updated_at = CASE WHEN t.state IN ('Scheduled', 'Paused') AND t.lease_expires_at IS NULL THEN now()
                          ELSE t.updated_at END,
{{control_order_set}}
    FROM k
    WHERE t.tenant_id = %(tenant_id)s AND t.service_call_id = k.service_call_id  -- only rows held: never waits
      AND (t.state IN ('Scheduled', 'Paused') OR %(control_seq)s::bigint IS NOT NULL)  -- else nothing to write
      AND {{control_in_order}}
    RETURNING t.service_call_id, t.state IN ('Scheduled', 'Paused') AS applied, NULL::timestamptz AS due_at
)
SELECT s.service_call_id, coalesce(u.applied, false) AS applied, u.due_at, k.service_call_id IS NULL AS claimed
FROM s LEFT JOIN k USING (service_call_id) LEFT JOIN u USING (service_call_id);

-- name: resume_timer
-- End timers' own pauses, of one tenant by key (and selector), each in stream order among its pauses and resumes.
WITH s AS MATERIALIZED (
    SELECT service_call_id FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id = ANY (%(service_call_ids)s::text[])
      AND {{carries_selector}}
    ORDER BY service_call_id
    FOR KEY SHARE
), k AS MATERIALIZED (
    SELECT service_call_id, paused_at IS NOT NULL AND state IN ('Scheduled', 'Paused') AS live FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id IN (SELECT service_call_id FROM s)
    ORDER BY service_call_id
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE timers t SET
        state = CASE WHEN NOT k.live OR t.lease_expires_at IS NOT NULL THEN t.state
                     WHEN EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = t.tenant_id AND p.paused_at IS NOT NULL)
                     THEN 'Paused' ELSE 'Scheduled' END,
        paused_at = CASE WHEN k.live THEN NULL ELSE t.paused_at END,
        claimed_at = CASE WHEN NOT k.live OR t.lease_expires_at IS NOT NULL THEN t.claimed_at END,
        updated_at = CASE WHEN k.live THEN now() ELSE t.updated_at END,
{{control_order_set}}
    FROM k
    WHERE t.tenant_id = %(tenant_id)s AND t.service_call_id = k.service_call_id
      AND (k.live OR %(control_seq)s::bigint IS NOT NULL)  -- else nothing to write
      AND {{control_in_order}}
    RETURNING t.service_call_id, k.live AS applied, CASE WHEN k.live AND t.state = 'Scheduled' THEN t.due_at END AS due_at
)
SELECT s.service_call_id, coalesce(u.applied, false) AS applied, u.due_at, k.service_call_id IS NULL AS claimed
FROM s LEFT JOIN k USING (service_call_id) LEFT JOIN u USING (service_call_id);

-- fragment: carries_selector
-- The row carries every pair of a selector (terms: timer_label_terms of it), or no selector was given.
(%(terms)s::text[] IS NULL OR (labels IS NOT NULL AND timer_label_terms(tenant_id, labels) @> %(terms)s::text[]))

-- fragment: control_order_set
-- What a pause or resume leaves of its order: its stream position, when it has one.
        control_seq = coalesce(%(control_seq)s::bigint, t.control_seq),
        control_stored_at = coalesce(%(control_stored_at)s::timestamptz, t.control_stored_at)

-- fragment: control_in_order
-- A pause or resume may change the timer: not earlier in the stream than its last pause or resume.
(%(control_seq)s::bigint IS NULL OR t.control_seq IS NULL OR t.control_stored_at IS NULL
           OR %(control_seq)s::bigint >= t.control_seq OR %(control_stored_at)s::timestamptz > t.control_stored_at)
