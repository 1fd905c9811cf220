-- Pause and resume of a tenant or of timers by key (adapters/postgres/pausing.py).
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

-- name: control_timers
-- Pause or resume timers by key (and selector), any tenants', each in stream order among its pauses and resumes.
WITH w AS MATERIALIZED (
    SELECT * FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(resume)b::boolean[],
                         %(control_seq)b::bigint[], %(control_stored_at)b::timestamptz[])
        AS w(tenant_id, service_call_id, resume, control_seq, control_stored_at)
), s AS MATERIALIZED (
    SELECT t.tenant_id, t.service_call_id
    FROM (SELECT DISTINCT tenant_id, service_call_id FROM w) AS key JOIN timers t USING (tenant_id, service_call_id)
    WHERE {{carries_selector}}
    ORDER BY t.tenant_id, t.service_call_id
    FOR KEY SHARE OF t
), k AS MATERIALIZED (
    SELECT t.tenant_id, t.service_call_id,
           t.state IN ('Scheduled', 'Paused') AND (NOT w.resume OR t.paused_at IS NOT NULL) AS live
    FROM s JOIN timers t USING (tenant_id, service_call_id) JOIN w USING (tenant_id, service_call_id)
    ORDER BY t.tenant_id, t.service_call_id
    FOR UPDATE OF t SKIP LOCKED
), u AS (
    UPDATE timers t SET
        state = CASE WHEN NOT k.live OR t.lease_expires_at IS NOT NULL THEN t.state
                     WHEN NOT w.resume OR EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = t.tenant_id AND p.paused_at IS NOT NULL)
                     THEN 'Paused' ELSE 'Scheduled' END,
        paused_at = CASE WHEN NOT k.live THEN t.paused_at WHEN NOT w.resume THEN coalesce(t.paused_at, now()) END,
        claimed_at = CASE WHEN NOT k.live OR t.lease_expires_at IS NOT NULL THEN t.claimed_at END,
        updated_at = CASE WHEN k.live AND (w.resume OR t.lease_expires_at IS NULL) THEN now() ELSE t.updated_at END,
        control_seq = coalesce(w.control_seq, t.control_seq),
        control_stored_at = coalesce(w.control_stored_at, t.control_stored_at)
    FROM k JOIN w USING (tenant_id, service_call_id)
    WHERE t.tenant_id = k.tenant_id AND t.service_call_id = k.service_call_id  -- only rows held: never waits
      AND (k.live OR w.control_seq IS NOT NULL)  -- else nothing to write
      AND (w.control_seq IS NULL OR t.control_seq IS NULL OR t.control_stored_at IS NULL
           OR w.control_seq >= t.control_seq OR w.control_stored_at > t.control_stored_at)
    RETURNING t.tenant_id, t.service_call_id, k.live AS applied,
              CASE WHEN k.live AND w.resume AND t.state = 'Scheduled' THEN t.due_at END AS due_at
)
SELECT s.tenant_id, s.service_call_id, coalesce(u.applied, false) AS applied, u.due_at,
       k.service_call_id IS NULL AS claimed
FROM s LEFT JOIN k USING (tenant_id, service_call_id) LEFT JOIN u USING (tenant_id, service_call_id);

-- fragment: carries_selector
-- The row carries every pair of a selector (terms: timer_label_terms of it), or no selector was given.
(%(terms)s::text[] IS NULL OR (labels IS NOT NULL AND timer_label_terms(tenant_id, labels) @> %(terms)s::text[]))
