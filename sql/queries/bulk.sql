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

-- name: plan_labels_index
-- This transaction's next statements read through bitmaps only: a selector's rows by the labels index.
SELECT set_config('enable_indexscan', 'off', true), set_config('enable_seqscan', 'off', true);

-- name: plan_key_range
-- This transaction's next statements read a tenant's key range in order, not a selector's bitmap.
SELECT set_config('enable_indexscan', 'on', true), set_config('enable_seqscan', 'on', true),
       set_config('enable_bitmapscan', 'off', true);

-- name: count_labelled
-- How many of a tenant's timers after a key carry a selector's pairs, up to a cap.
SELECT count(*) FROM (
    SELECT FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id > %(after)s AND {{carries_selector}}
    LIMIT %(cap)s
) AS c;
