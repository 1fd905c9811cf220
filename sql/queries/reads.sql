-- Reads: `get`, the gauges, `status`, `list` and `describe` (worker/ops/reads.py).
-- The why of each statement: docs/SQL.md.

-- fragment: listed_timer_columns
-- The columns a listing of timers shows (the CLI's `list`, the console's pages).
tenant_id, service_call_id, state, due_at, nominal_due_at, lease_owner, lease_expires_at, attempts,
last_error, fired_count, repeat_every

-- name: get_timers
-- The timers of one tenant's batch of `get`s, one primary-key probe each.
SELECT tenant_id, service_call_id, state, due_at, registered_at, updated_at, reached_at,
       correlation_id, attempts, last_error, lease_owner, lease_expires_at,
       repeat_every, repeat_times, repeat_timezone, anchor_due_at, occurrence_index, fired_count,
       repeat_cron, repeat_until, data, nominal_due_at, fire_window, expire_after, repeat_catchup,
       labels
FROM timers
WHERE tenant_id = %(tenant_id)s AND service_call_id = ANY (%(service_call_ids)s);

-- name: status_counts
-- Timers counted by state (a whole-table scan: `status` only).
SELECT state, count(*) FROM timers GROUP BY state;

-- name: status_overdue
-- Overdue unclaimed occurrences, up to a cap, and the age of the oldest.
SELECT count(*) AS overdue, extract(epoch FROM now() - min(due_at)) AS oldest_overdue_s
FROM (SELECT due_at FROM timers
      WHERE state = 'Scheduled' AND due_at <= now()
        AND (lease_expires_at IS NULL OR lease_expires_at < now())
      ORDER BY due_at
      LIMIT %(cap)s) AS o;

-- name: scheduled_estimate
-- Scheduled timers as the planner last counted the due index.
SELECT greatest(reltuples, 0)::bigint AS scheduled FROM pg_class WHERE oid = 'timers_due'::regclass;

-- name: status_leases
-- Live leases by replica: how many, and the soonest expiry.
SELECT lease_owner, count(*), min(lease_expires_at - now())
FROM timers
WHERE state = 'Scheduled' AND lease_expires_at > now()
GROUP BY lease_owner
ORDER BY lease_owner;

-- name: status_tenant_count
-- How many tenants have timers, by a loose scan of the primary key.
WITH RECURSIVE {{every_tenant}}
SELECT count(tenant_id) FROM tenants;

-- name: status_top_tenants
-- Tenants with the most Scheduled timers.
SELECT tenant_id, count(*) AS n
FROM timers
WHERE state = 'Scheduled'
GROUP BY tenant_id
ORDER BY n DESC, tenant_id
LIMIT %(top)s;

-- name: inspect_tenant_timers
-- One tenant's timers in key order, a page after a key, optionally filtered.
SELECT {{listed_timer_columns}},
       state = 'Scheduled' AND due_at <= now() AS overdue
FROM timers
WHERE tenant_id = %(tenant_id)s AND service_call_id > %(after)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(due_from)s::timestamptz IS NULL OR due_at >= %(due_from)s::timestamptz)
  AND (%(due_to)s::timestamptz IS NULL OR due_at < %(due_to)s::timestamptz)
  AND {{carries_selector}}
ORDER BY service_call_id
LIMIT %(limit)s;

-- name: inspect_due_timers
-- Scheduled timers of every tenant (or one) in due order, a page after a key.
SELECT {{listed_timer_columns}},
       due_at <= now() AS overdue
FROM timers
WHERE state = 'Scheduled'
  AND due_at >= %(after_due)s::timestamptz
  AND (due_at, tenant_id, service_call_id) > (%(after_due)s::timestamptz, %(after_tenant)s, %(after_id)s)
  AND due_at < coalesce(%(due_to)s::timestamptz, 'infinity')
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
ORDER BY due_at, tenant_id, service_call_id
LIMIT %(limit)s;

-- name: inspect_paused_timers
-- Paused timers of every tenant in key order, a page after a key.
SELECT {{listed_timer_columns}}, false AS overdue
FROM timers
WHERE state = 'Paused' AND (tenant_id, service_call_id) > (%(after_tenant)s, %(after_id)s)
  AND (%(due_from)s::timestamptz IS NULL OR due_at >= %(due_from)s::timestamptz)
  AND (%(due_to)s::timestamptz IS NULL OR due_at < %(due_to)s::timestamptz)
ORDER BY tenant_id, service_call_id
LIMIT %(limit)s;

-- name: inspect_timer
-- One timer, with what an operator asks about it, on the database clock.
SELECT t.*, now() AS db_now,
       t.state = 'Scheduled' AND t.due_at <= now() AS overdue,
       extract(epoch FROM now() - t.due_at) AS behind_s,
       t.lease_expires_at > now() AS lease_active
FROM timers t
WHERE tenant_id = %(tenant_id)s AND service_call_id = %(service_call_id)s;

-- name: inspect_tenant_counts
-- One tenant's timers counted by state.
SELECT state, count(*) FROM timers WHERE tenant_id = %(tenant_id)s GROUP BY state;

-- name: inspect_tenant_due
-- One tenant's overdue unclaimed occurrences (capped), the oldest, and the next due.
SELECT (SELECT count(*) FROM (SELECT 1 FROM timers
                              WHERE tenant_id = %(tenant_id)s AND state = 'Scheduled'
                                AND due_at <= now()
                                AND (lease_expires_at IS NULL OR lease_expires_at < now())
                              LIMIT %(cap)s) AS o) AS overdue,
       extract(epoch FROM now() - min(due_at) FILTER (WHERE due_at <= now())) AS oldest_overdue_s,
       min(due_at) FILTER (WHERE due_at > now()) AS next_due_at
FROM timers
WHERE tenant_id = %(tenant_id)s AND state = 'Scheduled';

-- name: paused_gauges
-- The paused timers (capped) and the paused tenants, for the gauges.
SELECT (SELECT count(*) FROM (SELECT 1 FROM timers WHERE state = 'Paused' LIMIT %(cap)s) AS p) AS paused,
       (SELECT count(*) FROM paused_tenants WHERE paused_at IS NOT NULL) AS tenants;

-- name: status_paused
-- Paused timers per tenant and the paused tenants, for `status`.
SELECT coalesce(c.tenant_id, p.tenant_id) AS tenant_id, coalesce(c.n, 0) AS paused, p.paused_at
FROM (SELECT tenant_id, count(*) AS n FROM timers WHERE state = 'Paused' GROUP BY tenant_id) AS c
FULL JOIN (SELECT * FROM paused_tenants WHERE paused_at IS NOT NULL) p ON p.tenant_id = c.tenant_id
ORDER BY coalesce(c.n, 0) DESC, 1
LIMIT %(top)s;

-- name: tenant_paused
-- Whether one tenant is paused, and since when.
SELECT paused_at FROM paused_tenants WHERE tenant_id = %(tenant_id)s AND paused_at IS NOT NULL;
