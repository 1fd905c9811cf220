-- Bulk actions: a cancel, pause or resume naming labels instead of a serviceCallId (core/bulk.py).
-- The why of each statement: docs/SQL.md.

-- name: select_labelled
-- The next chunk of a tenant's timers carrying every pair of a selector, in key order after a key.
SELECT service_call_id FROM timers
WHERE tenant_id = %(tenant_id)s AND service_call_id > %(after)s
  AND {{carries_selector}}
  AND state IN ('Scheduled', 'Paused')
  AND (%(command_seq)s::bigint IS NULL OR command_seq IS NULL OR command_stored_at IS NULL
       OR command_seq <= %(command_seq)s::bigint OR command_stored_at < %(command_stored_at)s::timestamptz)
ORDER BY service_call_id
LIMIT %(limit)s;
