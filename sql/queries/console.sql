-- The console's pages and searches (worker/ops/browse.py, worker/ops/fleet_stats.py).
-- The why of each statement: docs/SQL.md.

-- name: console_stats
-- The replicas' minute stats of a recent window, added up per bin of minutes and histogram bounds.
WITH minutes AS (
    SELECT date_bin(make_interval(mins => %(step)s), minute, TIMESTAMPTZ '2000-01-01 00:00Z') AS at, *
    FROM timer_stats
    WHERE minute >= date_bin(make_interval(mins => %(step)s), now() - make_interval(mins => %(window)s),
                             TIMESTAMPTZ '2000-01-01 00:00Z')
), per_bucket AS (
    SELECT m.at, m.lateness_le, u.i, sum(u.n)::bigint AS n
    FROM minutes m, unnest(m.lateness) WITH ORDINALITY AS u(n, i)
    GROUP BY m.at, m.lateness_le, u.i
), histograms AS (
    SELECT at, lateness_le, array_agg(n ORDER BY i) AS lateness FROM per_bucket GROUP BY at, lateness_le
)
SELECT b.at, b.lateness_le, b.fired, b.rejected, b.overdue, b.replicas, b.written_at,
       coalesce(h.lateness, '{}') AS lateness, now() AS db_now
FROM (
    SELECT at, lateness_le, sum(fired)::bigint AS fired, sum(rejected)::bigint AS rejected,
           max(overdue) AS overdue, count(DISTINCT worker_id) AS replicas, max(written_at) AS written_at
    FROM minutes GROUP BY at, lateness_le
) AS b LEFT JOIN histograms h USING (at, lateness_le)
ORDER BY b.at, b.written_at;

-- name: console_replicas
-- The replicas that wrote stats in the last ten minutes.
SELECT worker_id, max(written_at) AS last_seen, extract(epoch FROM now() - max(written_at)) AS ago_s
FROM timer_stats
WHERE minute >= date_trunc('minute', now()) - interval '10 minutes'
GROUP BY worker_id
ORDER BY worker_id;

-- name: console_find_correlation
-- Timers of any tenant with a correlationId.
SELECT {{listed_timer_columns}}, correlation_id,
       state = 'Scheduled' AND due_at <= now() AS overdue
FROM timers
WHERE correlation_id = %(correlation_id)s AND correlation_id IS NOT NULL
ORDER BY tenant_id, service_call_id
LIMIT %(limit)s;

-- fragment: every_tenant
-- The CTE `tenants`: every tenant with timers, one probe of the primary key each (a loose scan).
tenants(tenant_id) AS (
    (SELECT tenant_id FROM timers ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.tenant_id FROM timers t WHERE t.tenant_id > tenants.tenant_id
            ORDER BY t.tenant_id LIMIT 1)
    FROM tenants WHERE tenants.tenant_id IS NOT NULL
)

-- name: console_find_id
-- Timers of any tenant with a serviceCallId, by a loose scan of the primary key.
WITH RECURSIVE {{every_tenant}}
SELECT t.tenant_id, t.service_call_id, t.state, t.due_at, t.nominal_due_at, t.lease_owner,
       t.lease_expires_at, t.attempts, t.last_error, t.fired_count, t.repeat_every, t.correlation_id,
       t.state = 'Scheduled' AND t.due_at <= now() AS overdue
FROM tenants
JOIN timers t ON t.tenant_id = tenants.tenant_id AND t.service_call_id = %(service_call_id)s
ORDER BY t.tenant_id
LIMIT %(limit)s;

-- name: console_tenant_back
-- One tenant's timers in reverse key order: the previous page.
SELECT {{listed_timer_columns}},
       state = 'Scheduled' AND due_at <= now() AS overdue
FROM timers
WHERE tenant_id = %(tenant_id)s AND service_call_id < %(before)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND {{carries_selector}}
ORDER BY service_call_id DESC
LIMIT %(limit)s;

-- name: console_due_back
-- One tenant's Scheduled timers in reverse due order: the previous page.
SELECT {{listed_timer_columns}},
       due_at <= now() AS overdue
FROM timers
WHERE state = 'Scheduled'
  AND (due_at, tenant_id, service_call_id) < (%(before_due)s::timestamptz, %(before_tenant)s, %(before_id)s)
  AND tenant_id = %(tenant_id)s
ORDER BY due_at DESC, tenant_id DESC, service_call_id DESC
LIMIT %(limit)s;

-- name: console_labelled_count
-- A tenant's timers in some of the states Scheduled and Paused carrying a selector's pairs, up to a cap.
SELECT count(*) FROM (
    SELECT FROM timers
    WHERE tenant_id = %(tenant_id)s AND state = ANY(%(states)s::text[]) AND {{carries_selector}}
    LIMIT %(cap)s
) AS c;

-- name: console_tenants_by_name
-- A page of tenants in key order from a prefix, each with its pending bound, walking at most a cap.
WITH RECURSIVE walk(tenant_id, n) AS (
    (SELECT tenant_id, 1 FROM timers
     WHERE tenant_id > %(after)s AND tenant_id >= %(prefix)s
     ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.tenant_id FROM timers t WHERE t.tenant_id > walk.tenant_id
            ORDER BY t.tenant_id LIMIT 1), walk.n + 1
    FROM walk WHERE walk.tenant_id IS NOT NULL AND walk.n < %(scan)s
)
SELECT w.tenant_id, w.n, starts_with(w.tenant_id, %(prefix)s) AS matches,
       (SELECT coalesce(sum(p.pending), 0) FROM tenant_pending p WHERE p.tenant_id = w.tenant_id) AS pending
FROM walk w
WHERE w.tenant_id IS NOT NULL AND (starts_with(w.tenant_id, %(prefix)s) OR w.n = %(scan)s)
LIMIT %(limit)s;

-- name: console_tenants_by_pending
-- A page of the tenants with pending timers, most first, by their bounds in tenant_pending.
SELECT tenant_id, sum(pending) AS pending
FROM tenant_pending
WHERE starts_with(tenant_id, %(prefix)s)
GROUP BY tenant_id
HAVING sum(pending) > 0
   AND (sum(pending) < %(after_pending)s
        OR (sum(pending) = %(after_pending)s AND tenant_id > %(after_tenant)s))
ORDER BY pending DESC, tenant_id
LIMIT %(limit)s;
