-- Upkeep: retention, the replicas' minute stats, start-up checks and readiness.
-- The why of each statement: docs/SQL.md.

-- name: delete_finished
-- Retention: delete a batch of old finished rows (Reached, Expired, Cancelled), oldest first.
DELETE FROM timers t
WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM timers
                          WHERE state <> 'Scheduled' AND state <> 'Paused'
                            AND updated_at < now() - %(retention)s::interval
                          ORDER BY updated_at
                          LIMIT %(limit)s
                          FOR UPDATE SKIP LOCKED))
  AND t.state <> 'Scheduled' AND t.state <> 'Paused';

-- name: delete_decided
-- Retention: delete a batch of expiry decisions whose occurrence its timer no longer holds.
DELETE FROM timer_expiry e
WHERE e.ctid = ANY (ARRAY(SELECT d.ctid FROM timer_expiry d
                          WHERE NOT EXISTS (
                              SELECT 1 FROM timers t
                              WHERE (t.tenant_id, t.service_call_id) = (d.tenant_id, d.service_call_id)
                                AND (t.state = 'Scheduled' OR t.state = 'Paused')
                                AND coalesce(t.nominal_due_at, t.due_at) = d.due_at)
                          LIMIT %(limit)s
                          FOR UPDATE SKIP LOCKED));

-- name: stats_add
-- Add a replica's counters to the current minute's row.
INSERT INTO timer_stats AS s (minute, worker_id, fired, rejected, overdue, lateness_le, lateness)
VALUES (date_trunc('minute', now()), %(worker_id)s, %(fired)s, %(rejected)s, %(overdue)s,
        %(lateness_le)s, %(lateness)s)
ON CONFLICT (minute, worker_id) DO UPDATE SET
    fired = s.fired + excluded.fired,
    rejected = s.rejected + excluded.rejected,
    overdue = excluded.overdue,
    lateness_le = excluded.lateness_le,
    lateness = CASE WHEN s.lateness_le = excluded.lateness_le
                    THEN ARRAY(SELECT a + b FROM unnest(s.lateness, excluded.lateness) AS u(a, b))
                    ELSE excluded.lateness END,
    written_at = now();

-- name: stats_trim
-- Delete minute stats older than the retention.
DELETE FROM timer_stats WHERE minute < now() - %(keep)s::interval;

-- name: server_encoding
-- The database's name and encoding (only UTF8 holds every id).
SELECT current_database() AS database, pg_encoding_to_char(encoding) AS encoding
FROM pg_database WHERE datname = current_database();

-- name: fleet_secret
-- The key of every Nats-Msg-Id.
SELECT secret FROM fleet_secret;

-- name: ping
-- Readiness: the server answers (reads nothing).
SELECT 1;
