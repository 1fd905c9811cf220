-- The tenant quota: bounds, exact recounts and the folding of tenant_pending.
-- The why of each statement: docs/SQL.md.

-- name: quota_known_keys
-- Of the given keys, those a ScheduleTimer would not turn into a new pending timer.
SELECT t.tenant_id, t.service_call_id
FROM timers t
JOIN unnest(%(tenant_id)s::text[], %(service_call_id)s::text[]) AS k(tenant_id, service_call_id)
  ON t.tenant_id = k.tenant_id AND t.service_call_id = k.service_call_id
WHERE t.state IN ('Scheduled', 'Paused', 'Reached', 'Expired');

-- name: quota_bounds
-- An upper bound of each tenant's pending timers, and how many tenant_pending rows hold it.
SELECT k.tenant_id, sum(p.pending) AS bound, count(*) AS deltas
FROM unnest(%(tenant_id)b::text[]) AS k(tenant_id)
JOIN tenant_pending p ON p.tenant_id = k.tenant_id
GROUP BY k.tenant_id;

-- name: lock_quota_recount
-- Serialize recounts of the same tenants (advisory locks), before quota_recount.
SELECT count(pg_advisory_xact_lock(k)) AS n FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS u(k, i);

-- name: quota_recount
-- Count the tenants' pending timers exactly, up to a cap, and correct their bounds to it.
WITH c AS MATERIALIZED (
    SELECT k.tenant_id,
           (SELECT count(*) FROM (SELECT 1 FROM timers t
                                  WHERE t.tenant_id = k.tenant_id AND t.state IN ('Scheduled', 'Paused')
                                  LIMIT %(cap)s) AS c) AS pending,
           (SELECT coalesce(sum(p.pending), 0) FROM tenant_pending p WHERE p.tenant_id = k.tenant_id) AS bound
    FROM unnest(%(tenant_id)s::text[]) AS k(tenant_id)
), corrected AS (
    INSERT INTO tenant_pending (tenant_id, pending)
    SELECT tenant_id, pending - bound FROM c WHERE pending < %(cap)s AND pending <> bound
)
SELECT tenant_id, pending FROM c;

-- name: compact_pending
-- Fold tenant_pending rows into one per tenant, one fold at a time in the fleet.
WITH gate AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(%(lock)s::bigint) AS ours
), gone AS (
    DELETE FROM tenant_pending
    WHERE ctid = ANY (ARRAY(SELECT p.ctid
                            FROM unnest(%(tenant_id)b::text[]) AS k(tenant_id)
                            JOIN tenant_pending p ON p.tenant_id = k.tenant_id
                            WHERE (SELECT ours FROM gate)
                            UNION ALL
                            SELECT p.ctid FROM tenant_pending p
                            WHERE %(tenant_id)b::text[] IS NULL AND (SELECT ours FROM gate)
                            LIMIT %(limit)s))
    RETURNING tenant_id, pending
), folded AS (
    INSERT INTO tenant_pending (tenant_id, pending)
    SELECT tenant_id, sum(pending) FROM gone GROUP BY tenant_id HAVING sum(pending) <> 0
)
SELECT count(*) AS folded FROM gone;
