-- Every statement the service runs, by name. worker/adapters/postgres/queries.py loads them once.
-- Times always come from the database clock (now()), never from a replica.
-- Array parameters travel in binary (%(name)b): encoding 1,000-element arrays as text cost
-- a replica six times more CPU than the binary form.

-- name: lock_keys
-- First in every command batch's transaction: lock the rows of the batch's keys that exist, and
-- return those a claim's batch in flight holds. Such a batch holds its rows from the claim to the
-- mark (claim_due), its lease not visible to others until it commits: a command that waited on
-- that lock would, after a rollback (its replica died after the PubAck), meet the row as if the
-- timer had not fired, though its event is out. Its commands are deferred instead, as for a
-- claimed occurrence (Store.apply): the rolled-back occurrence is claimed and fired again first
-- (same Nats-Msg-Id: JetStream drops the copy), and the command comes back to a recorded timer.
-- The lock modes tell the holders apart: another batch of commands holds its rows FOR UPDATE
-- (INSERT ... ON CONFLICT DO UPDATE, this statement), and a claim FOR NO KEY UPDATE (claim_due).
-- FOR KEY SHARE waits for the first only: a batch of commands ahead of this one on a key still
-- goes first, in stream order, as before. Then FOR UPDATE SKIP LOCKED: a row it cannot take is
-- held by a claim's batch (or a pause's chunk: a short wait, treated alike). Nothing can
-- take the row FOR UPDATE between the two, the key share lock conflicting with it. A key whose
-- row is inserted and claimed after this statement's snapshot still waits in the INSERT (a row
-- that new has not fired). Keys in order, so two batches lock what they share in one order.
-- `claimable`: whether the row as committed could be in a claim at all (Scheduled, due within a
-- claim's reach, %(reach)s, no live lease); only then may its holder be a claim's batch firing it.
-- A claim also keeps the lock of a row it rechecked and left out: one another batch committed
-- (a recurring timer moved on, not due now) between the claim's snapshot and its lock, locked at
-- its newest version (READ COMMITTED) and held until that batch ends. Such a row holds no
-- occurrence of this claim, so its commands are offered again soon (Store.apply, "busy"), not a
-- lease later. A claimed row keeps its committed version until its batch ends, and that version
-- passed the claim's test before this clock reading, so it is always `claimable`: a misjudged
-- row costs a retry, never the fence (intake still never waits on the lock).
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

-- name: upsert_schedules
-- Insert new timers and reschedule existing ones, one row per key (the caller splits a batch
-- into rounds of distinct keys). The WHERE of DO UPDATE is the state machine, and it makes the
-- end state of a key the same as applying its commands in timestampMs order, whatever order
-- they arrive in:
--   * Reached is final: a late ScheduleTimer is acknowledged and ignored;
--   * a claimed occurrence (lease_expires_at set) is left alone: the command is retried after
--     it fired, so "once claimed, it fires" holds and recurring timers still get the change;
--   * an older command (timestampMs) never overwrites a newer one;
--   * a command restating the current definition (same dueAt and repeat) of a Scheduled timer
--     keeps its progress, so a redelivered copy cannot rewind a recurring timer to its first
--     occurrence; if it is newer it still records its timestampMs and correlationId, or an
--     older command arriving after it could win (Schedule 10, Schedule 30, Cancel 20 would
--     end Cancelled). A restatement that would change nothing writes nothing.
-- ON CONFLICT locks the row even when the WHERE is false, so claimed_among below sees it as is.
-- The restatement test reads the locked row (t): reading the row any earlier would race a mark.
-- carried_headers (trace context and allowed producer headers) and data are the command's, like its
-- correlationId: a newer restatement records it too, and an array of NULLs needs not be sent.
-- Stream order (commands without timestampMs): a command whose stream sequence (command_seq) is
-- past the oldest command waiting for the timer (deferred_seqs[1]) is left alone and waits too;
-- the waiting command itself, once applied, leaves deferred_seqs. A marker left unchanged for
-- %(order_grace)s while the timer is not claimed is stale (its command will not come back: aged
-- out, or applied by a release that ignores markers) and no longer holds anything up.
-- Stream position: unless timestampMs decides (the command and the timer both have one), a
-- command earlier in the stream than the last one applied to the timer (command_seq and
-- command_stored_at) is older and left alone, like an older timestampMs: two replicas that
-- fetched a timer's commands side by side may commit them in either order. Earlier means a
-- smaller sequence AND a stored time no later: a recreated stream's sequences start again at 1,
-- but its stored times are later, so its commands are never older; a redelivered command keeps
-- its position, so it is not older than itself. A restatement from a later position records it
-- (as a newer timestampMs does), or an earlier command arriving after it would win.
-- Pause (0011): a new timer of a paused tenant is stored Paused (its state column, as excluded.state,
-- carries that into DO UPDATE); a rescheduled one is Paused while it (paused_at) or its tenant is
-- paused. The IN (SELECT ... paused_tenants) is a hashed subplan, one read of that tiny table per
-- statement. Paused rows are restated like Scheduled ones (they keep their progress).
-- RETURNING: the rows this statement changed, with their dueAt (intake's wake-up hint); a Paused
-- one's too (a needless wake-up at worst).
INSERT INTO timers AS t (tenant_id, service_call_id, state, due_at, correlation_id, command_ts,
                         repeat_every, repeat_times, repeat_timezone, anchor_due_at, carried_headers,
                         command_seq, command_stored_at, repeat_cron, repeat_until, data)
SELECT i.tenant_id, i.service_call_id,
       CASE WHEN i.tenant_id IN (SELECT p.tenant_id FROM paused_tenants p WHERE p.paused_at IS NOT NULL) THEN 'Paused' ELSE 'Scheduled' END,
       i.due_at, i.correlation_id, i.command_ts,
       i.repeat_every, i.repeat_times, i.repeat_timezone, i.due_at, i.carried_headers, i.command_seq,
       i.command_stored_at, i.repeat_cron, i.repeat_until, i.data
FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(due_at)b::timestamptz[],
            %(correlation_id)b::text[], %(command_ts)b::bigint[], %(repeat_every)b::text[],
            %(repeat_times)b::int[], %(repeat_timezone)b::text[], %(carried_headers)b::jsonb[],
            %(command_seq)b::bigint[], %(command_stored_at)b::timestamptz[], %(repeat_cron)b::text[],
            %(repeat_until)b::timestamptz[], %(data)b::jsonb[])
     AS i(tenant_id, service_call_id, due_at, correlation_id, command_ts, repeat_every,
          repeat_times, repeat_timezone, carried_headers, command_seq, command_stored_at,
          repeat_cron, repeat_until, data)
ON CONFLICT (tenant_id, service_call_id) DO UPDATE SET
    state = CASE WHEN t.paused_at IS NOT NULL THEN 'Paused' ELSE excluded.state END,
    -- A restatement keeps the timer's progress; anything else starts it afresh.
    (due_at, occurrence_index, claimed_at) = (
        SELECT CASE WHEN r.same THEN t.due_at ELSE excluded.due_at END,
               CASE WHEN r.same THEN t.occurrence_index ELSE 0 END,
               CASE WHEN r.same THEN t.claimed_at END
        FROM (SELECT t.state IN ('Scheduled', 'Paused')
                     AND (t.anchor_due_at, t.repeat_every, t.repeat_times, t.repeat_timezone,
                          t.repeat_cron, t.repeat_until)
                         IS NOT DISTINCT FROM (excluded.due_at, excluded.repeat_every,
                                               excluded.repeat_times, excluded.repeat_timezone,
                                               excluded.repeat_cron, excluded.repeat_until)
                     AS same) AS r),
    anchor_due_at = excluded.due_at,
    correlation_id = excluded.correlation_id,
    carried_headers = excluded.carried_headers,
    command_ts = coalesce(excluded.command_ts, t.command_ts),
    repeat_every = excluded.repeat_every,
    repeat_times = excluded.repeat_times,
    repeat_timezone = excluded.repeat_timezone,
    repeat_cron = excluded.repeat_cron,
    repeat_until = excluded.repeat_until,
    data = excluded.data,
    attempts = 0,
    last_error = NULL,
    lease_owner = NULL,
    lease_token = NULL,
    command_seq = coalesce(excluded.command_seq, t.command_seq),
    command_stored_at = coalesce(excluded.command_stored_at, t.command_stored_at),
    deferred_seqs = CASE WHEN t.updated_at >= now() - %(order_grace)s::interval
                         THEN nullif(array_remove(t.deferred_seqs, excluded.command_seq), '{}') END,
    updated_at = now()
WHERE t.state <> 'Reached'
  AND t.lease_expires_at IS NULL
  AND (excluded.command_ts IS NULL OR t.command_ts IS NULL OR excluded.command_ts >= t.command_ts)
  AND ((excluded.command_ts IS NOT NULL AND t.command_ts IS NOT NULL)
       OR excluded.command_seq IS NULL OR t.command_seq IS NULL OR t.command_stored_at IS NULL
       OR excluded.command_seq >= t.command_seq OR excluded.command_stored_at > t.command_stored_at)
  AND (t.deferred_seqs IS NULL OR excluded.command_seq IS NULL OR excluded.command_seq <= t.deferred_seqs[1]
       OR t.updated_at < now() - %(order_grace)s::interval)
  AND NOT (t.state = CASE WHEN t.paused_at IS NOT NULL THEN 'Paused' ELSE excluded.state END
           AND (t.anchor_due_at, t.repeat_every, t.repeat_times, t.repeat_timezone, t.correlation_id,
                t.carried_headers, t.command_ts, t.command_seq, t.command_stored_at, t.repeat_cron,
                t.repeat_until, t.data)
               IS NOT DISTINCT FROM (excluded.due_at, excluded.repeat_every, excluded.repeat_times,
                                     excluded.repeat_timezone, excluded.correlation_id,
                                     excluded.carried_headers,
                                     coalesce(excluded.command_ts, t.command_ts),
                                     coalesce(excluded.command_seq, t.command_seq),
                                     coalesce(excluded.command_stored_at, t.command_stored_at),
                                     excluded.repeat_cron, excluded.repeat_until, excluded.data))
RETURNING t.tenant_id, t.service_call_id, t.due_at;

-- name: cancel_timers
-- Cancel while Scheduled and unclaimed. A cancel for an unknown key leaves a Cancelled
-- tombstone carrying its timestampMs, so an older ScheduleTimer arriving later stays ignored.
-- Stream order, stream position and deferred_seqs as in upsert_schedules. A Paused timer is cancelled
-- like a Scheduled one, and the cancel ends its own pause (paused_at): a later ScheduleTimer of the key
-- starts unpaused, unless its tenant is paused. Ending a pause, it takes its place in the order of
-- the timer's pauses and resumes (control_seq, 0013): a pause older than the cancel (deferred
-- behind a claim's batch) changes nothing when it comes back, even to a timer scheduled again since.
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
    command_ts = coalesce(excluded.command_ts, t.command_ts),
    command_seq = coalesce(excluded.command_seq, t.command_seq),
    command_stored_at = coalesce(excluded.command_stored_at, t.command_stored_at),
    control_seq = CASE WHEN excluded.command_seq IS NULL THEN t.control_seq ELSE excluded.command_seq END,
    control_stored_at = CASE WHEN excluded.command_seq IS NULL THEN t.control_stored_at
                             ELSE excluded.command_stored_at END,
    deferred_seqs = CASE WHEN t.updated_at >= now() - %(order_grace)s::interval
                         THEN nullif(array_remove(t.deferred_seqs, excluded.command_seq), '{}') END,
    updated_at = now()
WHERE t.state <> 'Reached'
  AND t.lease_expires_at IS NULL
  AND (excluded.command_ts IS NULL OR t.command_ts IS NULL OR excluded.command_ts >= t.command_ts)
  AND ((excluded.command_ts IS NOT NULL AND t.command_ts IS NOT NULL)
       OR excluded.command_seq IS NULL OR t.command_seq IS NULL OR t.command_stored_at IS NULL
       OR excluded.command_seq >= t.command_seq OR excluded.command_stored_at > t.command_stored_at)
  AND (t.deferred_seqs IS NULL OR excluded.command_seq IS NULL OR excluded.command_seq <= t.deferred_seqs[1]
       OR t.updated_at < now() - %(order_grace)s::interval)
RETURNING t.tenant_id, t.service_call_id, NULL::timestamptz AS due_at;

-- name: held_among
-- Of the given keys (commands the statements above left alone), those whose commands wait:
-- `claimed`, its current occurrence is claimed (`stuck`: first claimed longer than
-- %(stuck_after)s ago and still not recorded, a row that cannot be read or published, retried
-- with back-off: its commands are given up, README, guarantees); `head`, the stream sequence of
-- the oldest command waiting for it, unless stale (see upsert_schedules); `marked`, any is
-- recorded; `due_at`, the dueAt of a Scheduled one no lease holds: the statements above locked it
-- without changing it, so a claim meanwhile skipped it (SKIP LOCKED) and intake wakes the firing
-- loops for it once this transaction commits. OFFSET 0 keeps the state and lease tests out of the
-- scan of timers (see mark_fired): the keys drive, through the primary key.
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

-- name: settle_deferred
-- Record which commands wait for their timer (`waits`: deferred, their stream sequence joins
-- deferred_seqs) and which no longer do (ignored or given up: it leaves). Only for timers whose
-- commands wait or waited: the common path never runs it. updated_at is left alone, so a marker
-- whose oldest command never comes back still goes stale. Rows already locked by the batch.
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

-- name: claim_begin
-- The claim's transaction (Store.claim), and the plan of its claim_due: the due lanes walk the due
-- index in due order, whatever the statistics say. On a table whose heap order is not its due order
-- (months of scheduling), with few rows due per claim, the planner chose a bitmap scan and a sort
-- (issue 36): a bitmap scan never marks dead index entries (an index scan does), so every claim
-- re-read every occurrence fired since the last vacuum, Postgres' CPU per fire 8 x the empty
-- table's. With statistics taken before a burst it expected a few hundred due rows and sorted all
-- 50,000 (issue 37). Without bitmap scans and sorts the one way to rows in due order is the index,
-- read as far as the LIMIT. Settings of this transaction only (SET LOCAL: intake's statements plan
-- as ever), sent with its BEGIN in one simple-protocol message: no round trip of their own. Its
-- other statements (mark_fired, retry_later) find their rows by ctid, a TID scan under any settings
-- (tests/integration/test_plans.py).
BEGIN;
SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_sort = off;

-- name: claim_due
-- Claim a batch of due occurrences under a lease, and say when the next one comes due.
-- "Due" includes the next %(ahead_ms)s milliseconds: the replica holds those until their
-- dueAt on its estimate of this clock (never ahead of it) and publishes them the moment they
-- come due, so a claim's own duration does not add to their lateness.
-- It runs first in the batch's transaction (Store.claim), which mark_fired and retry_later end:
-- the row locks taken here are held until the batch is recorded, and they are the fence
-- (docs/RELIABILITY.md, The claim's transaction). The lease written here commits with the mark;
-- other sessions see it only when a batch ends unrecorded (a stop) and the lease is all that
-- keeps its occurrences from being claimed again at once.
-- A one-shot occurrence is written here as fired (`recorded`): its batch commits that only once
-- its event is acknowledged, else puts it back as it was, leased (retry_later, in the same
-- transaction: Batch.record, Batch.close). One write of the row per firing, not a lease and then
-- a mark: about 0.6 x Postgres' CPU per fire (docs/BENCHMARKS.md).
WITH
-- Oldest first, so an overdue backlog drains in order. Rows whose lease ran out (their replica
-- died, or its publish failed and the back-off passed) are claimable again right here: no
-- separate reaper. SKIP LOCKED lets replicas claim side by side without waiting on each other,
-- and passes over the rows of every batch still in flight, and of commands being applied. NO KEY
-- UPDATE, the mode the UPDATE below takes anyway, not FOR UPDATE: intake tells a claim's lock
-- from a command's by it (lock_keys). The row's ctid is the UPDATE's
-- way back to it (below): the lock keeps that version in place until this statement updates it.
oldest AS MATERIALIZED (
    SELECT ctid FROM timers
    WHERE state = 'Scheduled' AND due_at <= now() + %(ahead_ms)s * interval '1 millisecond'
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY due_at
    LIMIT %(oldest_limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
-- The most recently due, from the last %(fresh_window_ms)s only: the firing loop's fresh lane
-- claims these while a backlog drains, so timers coming due now are not starved behind it
-- (catch-up after downtime, or one tenant's flood), and the backlog itself still drains
-- oldest first. The two overlap only when fewer rows are due than the batch holds; shared
-- rows are locked by this statement itself and merge in the UNION below.
newest AS MATERIALIZED (
    SELECT ctid FROM timers
    WHERE state = 'Scheduled' AND due_at <= now() + %(ahead_ms)s * interval '1 millisecond'
      AND due_at > now() - %(fresh_window_ms)s * interval '1 millisecond'
      AND (lease_expires_at IS NULL OR lease_expires_at < now())
    ORDER BY due_at DESC
    LIMIT %(fresh_limit)s
    FOR NO KEY UPDATE SKIP LOCKED
),
-- One fencing token per claim from a fleet-wide sequence: it names this claim, which is all a
-- fence needs (a sequence call per row cost a quarter of the claim). Taken here, not in the
-- UPDATE, so the UPDATE calls no volatile function.
token AS MATERIALIZED (
    SELECT nextval('timer_lease_token') AS lease_token
),
-- The claim. A one-shot occurrence (no repeat: worker/core/recurrence.py next_of) whose row holds
-- nothing this write would take and retry_later could not put back (no pause, earlier firing's
-- reachedAt, error or waiting commands: those are leased and then marked) is recorded here as
-- mark_fired records it, but for what it says of the claim: its lease token, attempts (claims of
-- the occurrence, this one counted) and recurrence reference stay as a lease sets them, and
-- reached_at is when it was claimed, never before its dueAt (a claim reaches ahead). The test is
-- repeated in each column (an UPDATE's FROM cannot read the row; joining the lanes' rows back
-- for it cost the claim 1.3 x), and it leaves paused_at and last_error as they are, none.
-- A recurring occurrence gets the lease: the token and an expiry on the database clock; only
-- lease columns change, none indexed, so on a page with room this is a HOT update, and its next
-- occurrence is computed by the replica and recorded by mark_fired. The rows are found by
-- `ctid = ANY`: a TID scan whatever the statistics and cost settings. Joined back by key, the
-- planner chose a sequential scan and a hash join at 50,000 rows with the default
-- random_page_cost (tests/integration/test_plans.py). A row updated by another transaction
-- between this statement's snapshot and its lock is locked at its new version, which this
-- snapshot does not see: it is left out of this claim and, unleased, taken by the next one.
claimed AS (
    UPDATE timers t SET
        state = CASE WHEN (num_nonnulls(t.repeat_every, t.repeat_cron) = 0 OR t.anchor_due_at IS NULL)
                         AND num_nonnulls(t.paused_at, t.reached_at, t.last_error, t.deferred_seqs) = 0
                        THEN 'Reached' ELSE t.state END,
        fired_count = CASE WHEN (num_nonnulls(t.repeat_every, t.repeat_cron) = 0 OR t.anchor_due_at IS NULL)
                         AND num_nonnulls(t.paused_at, t.reached_at, t.last_error, t.deferred_seqs) = 0
                        THEN least(t.fired_count, 2147483646) + 1 ELSE t.fired_count END,
        reached_at = CASE WHEN (num_nonnulls(t.repeat_every, t.repeat_cron) = 0 OR t.anchor_due_at IS NULL)
                         AND num_nonnulls(t.paused_at, t.reached_at, t.last_error, t.deferred_seqs) = 0
                        THEN greatest(t.due_at, statement_timestamp()) ELSE t.reached_at END,
        updated_at = CASE WHEN (num_nonnulls(t.repeat_every, t.repeat_cron) = 0 OR t.anchor_due_at IS NULL)
                         AND num_nonnulls(t.paused_at, t.reached_at, t.last_error, t.deferred_seqs) = 0
                        THEN greatest(t.due_at, statement_timestamp()) ELSE t.updated_at END,
        lease_owner = CASE WHEN (num_nonnulls(t.repeat_every, t.repeat_cron) = 0 OR t.anchor_due_at IS NULL)
                         AND num_nonnulls(t.paused_at, t.reached_at, t.last_error, t.deferred_seqs) = 0
                        THEN NULL ELSE %(owner)s END,
        lease_token = token.lease_token,
        lease_expires_at = CASE WHEN (num_nonnulls(t.repeat_every, t.repeat_cron) = 0 OR t.anchor_due_at IS NULL)
                         AND num_nonnulls(t.paused_at, t.reached_at, t.last_error, t.deferred_seqs) = 0
                        THEN NULL ELSE now() + %(lease_ms)s * interval '1 millisecond' END,
        -- Saturates: `+ 1` past integer's maximum would fail the whole claim, one row stopping the fleet.
        attempts = least(t.attempts, 2147483646) + 1,
        -- A recurring timer's next occurrence is the first due after this (worker/core/recurrence.py).
        -- Downtime is the only reason to skip one: the timer sat claimable and unclaimed for
        -- %(downtime_ms)s (since it came due, its lease ran out, or mark_fired carried the
        -- reference to it), and then the reference is now, so the missed window fires once.
        -- Otherwise the fleet was claiming (a crash, a poll interval's wait): a re-claim or a
        -- carried reference is kept, and a fresh occurrence counts from its own dueAt, so
        -- whatever came due meanwhile still fires, late and in order.
        claimed_at = CASE
            WHEN t.claimed_at IS NULL AND t.due_at >= now() - %(downtime_ms)s * interval '1 millisecond'
                THEN least(t.due_at, now())
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
              t.repeat_cron, t.repeat_until, t.data::text AS data
)
-- Every row is a claimed occurrence with two named columns: the next occurrence beyond this
-- claim's reach (NULL when none), and the clock read as the row is returned (the latest of those
-- is as late in the statement as it can be read, after the whole UPDATE; the replica keeps that
-- one for its estimate of this clock, worker/core/clock.py). A claim that took nothing still returns
-- one row, its timer columns NULL (the LEFT JOIN), so an idle replica needs this single statement
-- per wake-up; nothing depends on the order of the rows. The replica reads the columns by name
-- (worker/adapters/postgres/claim.py): their order is free, a missing one fails the claim.
SELECT c.*, n.next_due_at, clock_timestamp() AS db_now
FROM (SELECT min(due_at) AS next_due_at FROM timers
      WHERE state = 'Scheduled' AND due_at > now() + %(ahead_ms)s * interval '1 millisecond') n
LEFT JOIN claimed c ON true;

-- name: mark_fired
-- Record firings whose DueTimeReached JetStream acknowledged, in the claim's own transaction
-- (claim_due). The fence is that transaction: its row locks keep every other session off these
-- rows since the claim, and if its session is ended under it (idle_in_transaction_session_timeout
-- for a replica frozen mid-batch, a dropped connection) Postgres rolls the claim back and this
-- statement has nothing to commit into. A paused replica that wakes up changes nothing. The
-- token and dueAt are checked too: a row id is only ever marked with the claim it came from.
-- A recurring timer moves to its next occurrence in this same statement, so a crash can neither
-- skip nor double one.
-- The rows are found by their ctid (row_id, from claim_due; the lock keeps them in place), as
-- `ctid = ANY (ARRAY(SELECT ...))`: the planner cannot see how long that array is and takes it
-- for 10 ids, so a TID scan costs it less than reading any table past a few dozen pages,
-- whatever the statistics and random_page_cost. With the array as a parameter it saw 1,000 ids
-- at random_page_cost each and read 50,000 rows sequentially instead; joined by key, it chose a
-- sequential scan and a hash join there, and at 200,000 rows once leases were rare in the
-- statistics (1.1 s for 1,000 marks against 17 ms). tests/integration/test_plans.py.
-- Times are statement_timestamp(), not now(): now() is when the claim began.
WITH f AS MATERIALIZED (
    SELECT f.*, f.row_id::tid AS tid, statement_timestamp() AS db_now
    FROM unnest(%(row_id)b::text[], %(lease_token)b::bigint[], %(due_at)b::timestamptz[],
                %(next_due_at)b::timestamptz[], %(next_index)b::int[])
         AS f(row_id, lease_token, due_at, next_due_at, next_index)
)
UPDATE timers t SET
    -- Paused (0011): the next occurrence of a timer paused while this one was claimed (its own
    -- paused_at, or its tenant's flag: one hashed read of that tiny table per statement).
    state = CASE WHEN f.next_due_at IS NULL THEN 'Reached'
                 WHEN t.paused_at IS NOT NULL
                   OR t.tenant_id IN (SELECT p.tenant_id FROM paused_tenants p WHERE p.paused_at IS NOT NULL)
                 THEN 'Paused' ELSE 'Scheduled' END,
    -- A finished timer's own pause ends, as a cancel's does: a later ScheduleTimer starts unpaused.
    paused_at = CASE WHEN f.next_due_at IS NOT NULL THEN t.paused_at END,
    due_at = coalesce(f.next_due_at, t.due_at),
    occurrence_index = coalesce(f.next_index, t.occurrence_index),
    fired_count = least(t.fired_count, 2147483646) + 1,  -- saturates, as attempts in claim_due
    reached_at = f.db_now,
    updated_at = f.db_now,
    lease_owner = NULL,
    lease_expires_at = NULL,
    -- A finished timer keeps the count of claims that fired it, as claim_due records a one-shot
    -- occurrence; a next occurrence starts at none (docs/CONTRACT.md, attempts).
    attempts = CASE WHEN f.next_due_at IS NULL THEN t.attempts ELSE 0 END,
    -- The next occurrence is due already: it came due while this one was held up (a crashed
    -- claim's lease, a slow publish). It keeps this occurrence's reference, however overdue it
    -- is, so claim_due does not take a chain of crashes for downtime.
    claimed_at = CASE WHEN f.next_due_at <= f.db_now THEN t.claimed_at END,
    last_error = NULL
FROM f
WHERE t.ctid = ANY (ARRAY(SELECT tid FROM f))
  AND t.ctid = f.tid
  AND t.lease_token = f.lease_token
  AND t.due_at = f.due_at;

-- name: mark_fired_again
-- Record again, in a transaction of its own, firings whose claim's transaction ended after their
-- PubAck (its session killed or timed out, a dropped connection: Batch.record raised). Postgres
-- rolled the claim back, and the row looks as if never claimed though its event is out; a
-- command arriving now would apply to it (a reschedule would fire a one-shot timer twice), so
-- the firing loop records them at once (docs/RELIABILITY.md, The claim's transaction).
-- No lease token fences this: the claim is gone. The row is found by key, and marked only while
-- it still holds the very occurrence that was published, so a command or a claim that came
-- between wins and this marks nothing:
--   * state Scheduled, the same dueAt and occurrence index, and the same definition (anchor and
--     repeat: the next occurrence was computed from them; a reschedule to the same dueAt with
--     another repeat is another timer);
--   * no live lease: a claim committed since (a stop's, or a failed publish's back-off) owns it;
--   * FOR UPDATE SKIP LOCKED: a row locked now is another replica's batch in flight (it
--     republishes with the same Nats-Msg-Id, deduplicated, and marks it) or a command being
--     applied (the window that remains). FOR UPDATE, not a claim's NO KEY UPDATE: intake's
--     lock_keys waits for this short transaction, and then meets the recorded timer.
-- Then it sets exactly what mark_fired sets. claimed_at is the claim's recurrence reference
-- (recurrence_ref): the rolled-back row no longer holds it, and so are the attempts a finished
-- timer keeps (the claim's).
WITH f AS MATERIALIZED (
    SELECT f.*, statement_timestamp() AS db_now
    FROM unnest(%(tenant_id)b::text[], %(service_call_id)b::text[], %(due_at)b::timestamptz[],
                %(occurrence_index)b::int[], %(anchor_due_at)b::timestamptz[], %(repeat_every)b::text[],
                %(repeat_times)b::int[], %(repeat_timezone)b::text[], %(repeat_cron)b::text[],
                %(repeat_until)b::timestamptz[], %(recurrence_ref)b::timestamptz[],
                %(next_due_at)b::timestamptz[], %(next_index)b::int[], %(attempts)b::int[])
         AS f(tenant_id, service_call_id, due_at, occurrence_index, anchor_due_at, repeat_every,
              repeat_times, repeat_timezone, repeat_cron, repeat_until, recurrence_ref,
              next_due_at, next_index, attempts)
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
      AND (t.lease_expires_at IS NULL OR t.lease_expires_at < f.db_now)
    FOR UPDATE OF t SKIP LOCKED
)
UPDATE timers t SET
    -- As mark_fired, column for column, but claimed_at and attempts (above).
    state = CASE WHEN f.next_due_at IS NULL THEN 'Reached'
                 WHEN t.paused_at IS NOT NULL
                   OR t.tenant_id IN (SELECT p.tenant_id FROM paused_tenants p WHERE p.paused_at IS NOT NULL)
                 THEN 'Paused' ELSE 'Scheduled' END,
    paused_at = CASE WHEN f.next_due_at IS NOT NULL THEN t.paused_at END,
    due_at = coalesce(f.next_due_at, t.due_at),
    occurrence_index = coalesce(f.next_index, t.occurrence_index),
    fired_count = least(t.fired_count, 2147483646) + 1,
    reached_at = f.db_now,
    updated_at = f.db_now,
    lease_owner = NULL,
    lease_expires_at = NULL,
    attempts = CASE WHEN f.next_due_at IS NULL THEN f.attempts ELSE 0 END,
    claimed_at = CASE WHEN f.next_due_at <= f.db_now THEN f.recurrence_ref END,
    last_error = NULL
FROM still JOIN f ON (still.tenant_id, still.service_call_id) = (f.tenant_id, f.service_call_id)
WHERE (t.tenant_id, t.service_call_id) = (still.tenant_id, still.service_call_id);

-- name: retry_later
-- A publish failed or timed out (it may still have reached the stream), or the row could not be
-- made into an event: keep the occurrence claimed, so it still fires, and let any replica retry
-- it after its own back-off, counted from now (statement_timestamp(): now() is the claim's
-- start). In the claim's transaction, fenced and found like mark_fired. A stop (Batch.close)
-- holds its claim's recorded occurrences the same way, as their owner's (`owner`: NULL for a
-- back-off, any replica retries it), with no error, for the claim's own lease: counted from now(),
-- the claim's start as this is its transaction, as claim_due's lease is, so they run out with the
-- rows it leased, not a batch's duration later.
-- A one-shot occurrence the claim recorded as fired (claim_due, `record`) is put back as the claim
-- would have left it as a lease: Scheduled, its count of firings one less, and no reachedAt,
-- pause or error before this one (the rows claim_due records hold none). Its updatedAt, which the
-- claim's write replaced (its value before is gone), is when it was claimed: now(), the claim's
-- start; not the claim's record of it, its reachedAt, which for a claim ahead is a dueAt still to
-- come (`describe` showed a Scheduled timer updated in the future).
-- In the claim's transaction, its row never looked fired to anyone: no command meets it so.
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

-- name: get_timers
-- The timers of one tenant's batch of `get`s (worker/core/readmodel.py): one query for them all,
-- a probe of the primary key each.
SELECT tenant_id, service_call_id, state, due_at, registered_at, updated_at, reached_at,
       correlation_id, attempts, last_error, lease_owner, lease_expires_at,
       repeat_every, repeat_times, repeat_timezone, anchor_due_at, occurrence_index, fired_count,
       repeat_cron, repeat_until, data
FROM timers
WHERE tenant_id = %(tenant_id)s AND service_call_id = ANY (%(service_call_ids)s);

-- name: status_counts
-- Counts by state: a scan of the whole table (no index holds every state), for the CLI's
-- `status`, never for a loop.
SELECT state, count(*) FROM timers GROUP BY state;

-- name: status_overdue
-- Overdue occurrences not yet claimed (counted up to %(cap)s, so a huge backlog stays cheap)
-- and the age of the oldest: the first entries of the due index.
SELECT count(*) AS overdue, extract(epoch FROM now() - min(due_at)) AS oldest_overdue_s
FROM (SELECT due_at FROM timers
      WHERE state = 'Scheduled' AND due_at <= now()
        AND (lease_expires_at IS NULL OR lease_expires_at < now())
      ORDER BY due_at
      LIMIT %(cap)s) AS o;

-- name: scheduled_estimate
-- Scheduled timers, as the planner last counted them in the due index: free to read.
SELECT greatest(reltuples, 0)::bigint AS scheduled FROM pg_class WHERE oid = 'timers_due'::regclass;

-- name: status_leases
SELECT lease_owner, count(*), min(lease_expires_at - now())
FROM timers
WHERE state = 'Scheduled' AND lease_expires_at > now()
GROUP BY lease_owner
ORDER BY lease_owner;

-- name: status_top_tenants
-- Tenants with the most Scheduled timers, from the due index only.
SELECT tenant_id, count(*) AS n
FROM timers
WHERE state = 'Scheduled'
GROUP BY tenant_id
ORDER BY n DESC, tenant_id
LIMIT %(top)s;

-- name: delete_finished
-- Retention: delete up to %(limit)s Reached/Cancelled rows last changed before the cutoff, oldest
-- first, walking the partial index timers_done (so pending rows are never read, and the due
-- index is untouched: finished rows are not in it). SKIP LOCKED: replicas sweeping side by side
-- take disjoint rows, and a row a command is changing right now is left for the next sweep. Each
-- statement holds its row locks only for the few milliseconds one small batch takes.
-- Paused rows (0011) are never deleted, and not in timers_done (0012): its predicate is this WHERE,
-- so a pause older than TIMER_RETENTION costs a sweep nothing (it walked them all, in every batch).
-- The rows are deleted by ctid (`ctid = ANY (ARRAY(...))`: a TID scan whatever the statistics; the
-- lock keeps each row where it is). Joined back by key, with statistics taken before any timer
-- finished (a bulk-loaded or quiet table), the planner expected no row and ran the batch's
-- subquery once per finished row (a nested loop): on issue 36's soak the first sweep held a core
-- for a minute and the vacuum horizon with it (tests/integration/test_retention.py).
DELETE FROM timers t
WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM timers
                          WHERE state <> 'Scheduled' AND state <> 'Paused'
                            AND updated_at < now() - %(retention)s::interval
                          ORDER BY updated_at
                          LIMIT %(limit)s
                          FOR UPDATE SKIP LOCKED))
  AND t.state <> 'Scheduled' AND t.state <> 'Paused';

-- name: quota_known_keys
-- Quota: of the given keys, those a ScheduleTimer would not turn into a new pending timer:
-- Scheduled or Paused (a reschedule) or Reached (ignored). Primary-key lookups.
SELECT t.tenant_id, t.service_call_id
FROM timers t
JOIN unnest(%(tenant_id)s::text[], %(service_call_id)s::text[]) AS k(tenant_id, service_call_id)
  ON t.tenant_id = k.tenant_id AND t.service_call_id = k.service_call_id
WHERE t.state IN ('Scheduled', 'Paused', 'Reached');

-- name: quota_bounds
-- Quota: an upper bound of each given tenant's pending (Scheduled or Paused) timers, and how many
-- rows of tenant_pending hold it (migration 0014: deltas Postgres adds as timers become pending,
-- and quota_recount's corrections). An index range of a few rows per tenant, however many timers
-- it has; a tenant with none has no row.
-- The tenants drive, each an index range (its rows are next to each other): `tenant_id = ANY` of a
-- batch's 630 tenants was a scan of the whole table, each row tested against the whole array.
SELECT k.tenant_id, sum(p.pending) AS bound, count(*) AS deltas
FROM unnest(%(tenant_id)b::text[]) AS k(tenant_id)
JOIN tenant_pending p ON p.tenant_id = k.tenant_id
GROUP BY k.tenant_id;

-- name: lock_quota_recount
-- Before quota_recount, in its transaction: the tenants' keys (worker/adapters/postgres/store.py,
-- recount_lock_keys), in the given (sorted) order. Two replicas recounting one tenant at once
-- would each add the same correction, and take the bound below the count; the second waits here
-- and its recount, a statement of its own, then sees the first one's correction.
SELECT count(pg_advisory_xact_lock(k)) AS n FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS u(k, i);

-- name: quota_recount
-- Quota: each given tenant's pending timers counted exactly, through the primary key's range for
-- the tenant, up to %(cap)s and no further (cost grows with the tenant's rows up to the cap, plus
-- its finished rows kept for TIMER_RETENTION): only for tenants whose bound left no room. A count
-- under the cap is exact, and the tenant's bound is brought down to it: one row of the count less
-- the bound, both read in this statement's one snapshot. The deltas of writes it does not see are
-- not in its count either, and stay, so the bound still covers them. A count at the cap leaves the
-- bound as it is (at the cap or above, so the tenant is counted again next time).
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
-- Fold the given tenants' rows of tenant_pending into one each (none when the sum is 0): a delete
-- and the insert of its sum in one statement, so every snapshot sees the same sums. One fold at a
-- time in the fleet (a transaction-level advisory lock, tried: a fold that does not get it folds
-- nothing and waits for nothing), so the delete takes no row lock first: two folds deleting the
-- same rows in different orders could deadlock, and locking each row before deleting it doubled
-- the fold's writes. The triggers only insert, and rows of writes not yet committed are not seen,
-- and stay. A row a fold that finished meanwhile deleted is skipped (READ COMMITTED rechecks it).
-- No tenants (NULL): any tenant's rows, up to %(limit)s. How many rows went.
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

-- Inspection (worker/ops/reads.py: `timer-service list`, `describe`, `status --tenant` and the
-- console). Operator reads, one at a time: never in a loop of the service.

-- name: inspect_tenant_timers
-- One tenant's timers in key order, a page after %(after)s: a range of the primary key (tenant_id
-- leads it), so a page costs the rows it reads. State and due window filter that range; a filter
-- that matches little on a tenant with many rows reads more of it to fill the page.
SELECT tenant_id, service_call_id, state, due_at, lease_owner, lease_expires_at, attempts,
       last_error, fired_count, repeat_every,
       state = 'Scheduled' AND due_at <= now() AS overdue
FROM timers
WHERE tenant_id = %(tenant_id)s AND service_call_id > %(after)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
  AND (%(due_from)s::timestamptz IS NULL OR due_at >= %(due_from)s::timestamptz)
  AND (%(due_to)s::timestamptz IS NULL OR due_at < %(due_to)s::timestamptz)
ORDER BY service_call_id
LIMIT %(limit)s;

-- name: inspect_due_timers
-- Scheduled timers of every tenant (or one) in due order, a page after the key (%(after_due)s,
-- %(after_tenant)s, %(after_id)s): a range of the due index, ties broken by the primary key.
SELECT tenant_id, service_call_id, state, due_at, lease_owner, lease_expires_at, attempts,
       last_error, fired_count, repeat_every,
       due_at <= now() AS overdue
FROM timers
WHERE state = 'Scheduled'
  AND due_at >= %(after_due)s::timestamptz
  AND (due_at, tenant_id, service_call_id) > (%(after_due)s::timestamptz, %(after_tenant)s, %(after_id)s)
  AND due_at < coalesce(%(due_to)s::timestamptz, 'infinity')
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
ORDER BY due_at, tenant_id, service_call_id
LIMIT %(limit)s;

-- name: inspect_timer
-- One timer with everything an operator asks about it, judged on the database clock.
SELECT t.*, now() AS db_now,
       t.state = 'Scheduled' AND t.due_at <= now() AS overdue,
       extract(epoch FROM now() - t.due_at) AS behind_s,
       t.lease_expires_at > now() AS lease_active
FROM timers t
WHERE tenant_id = %(tenant_id)s AND service_call_id = %(service_call_id)s;

-- name: inspect_tenant_counts
-- One tenant's timers by state: a range of the primary key.
SELECT state, count(*) FROM timers WHERE tenant_id = %(tenant_id)s GROUP BY state;

-- name: inspect_tenant_due
-- One tenant's overdue unclaimed occurrences (counted up to %(cap)s), the oldest of them, and the
-- next one to come due.
SELECT (SELECT count(*) FROM (SELECT 1 FROM timers
                              WHERE tenant_id = %(tenant_id)s AND state = 'Scheduled'
                                AND due_at <= now()
                                AND (lease_expires_at IS NULL OR lease_expires_at < now())
                              LIMIT %(cap)s) AS o) AS overdue,
       extract(epoch FROM now() - min(due_at) FILTER (WHERE due_at <= now())) AS oldest_overdue_s,
       min(due_at) FILTER (WHERE due_at > now()) AS next_due_at
FROM timers
WHERE tenant_id = %(tenant_id)s AND state = 'Scheduled';

-- name: inspect_lateness
-- How late one-shot timers fired in the last %(window)s (recorded minus due: reached_at is when the
-- occurrence was claimed to fire, never before its dueAt; its PubAck, a few milliseconds later, is
-- in timer_lateness_seconds): the newest finished rows of the finished index. Recurring timers
-- stay Scheduled and are not counted.
SELECT count(*) AS fired,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM reached_at - due_at)) AS p50_s,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM reached_at - due_at)) AS p99_s,
       max(extract(epoch FROM reached_at - due_at)) AS max_s
FROM timers
WHERE state <> 'Scheduled' AND state <> 'Paused' AND updated_at > now() - %(window)s::interval
  AND state = 'Reached' AND reached_at IS NOT NULL;

-- name: server_encoding
-- The database's encoding: only UTF8 holds every id (store.require_utf8).
SELECT current_database() AS database, pg_encoding_to_char(encoding) AS encoding
FROM pg_database WHERE datname = current_database();

-- name: fleet_secret
-- The key of every Nats-Msg-Id (worker/contract.py, MessageIds); read once per replica or CLI run.
SELECT secret FROM fleet_secret;

-- The replicas' minute stats (worker/adapters/postgres/stats.py) and the console's reads of them.

-- name: stats_add
-- Add a replica's counters since its last write to the current minute's row (the database's
-- minute); the lateness buckets add element by element. overdue is a level: the latest wins.
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
-- Retention of timer_stats: rows older than %(keep)s, oldest first through the primary key.
DELETE FROM timer_stats WHERE minute < now() - %(keep)s::interval;

-- name: console_stats
-- Every replica's rows of the last %(window)s minutes, for the console's charts.
SELECT minute, worker_id, fired, rejected, overdue, lateness_le, lateness, written_at, now() AS db_now
FROM timer_stats
WHERE minute >= date_trunc('minute', now()) - make_interval(mins => %(window)s)
ORDER BY minute;

-- name: console_replicas
-- The replicas that wrote stats lately: alive, whether or not they hold a lease now.
SELECT worker_id, max(written_at) AS last_seen, extract(epoch FROM now() - max(written_at)) AS ago_s
FROM timer_stats
WHERE minute >= date_trunc('minute', now()) - interval '10 minutes'
GROUP BY worker_id
ORDER BY worker_id;

-- name: console_find_correlation
-- Timers of any tenant with this correlationId: the partial index timers_correlation.
SELECT tenant_id, service_call_id, state, due_at, lease_owner, lease_expires_at, attempts,
       last_error, fired_count, repeat_every, correlation_id,
       state = 'Scheduled' AND due_at <= now() AS overdue
FROM timers
WHERE correlation_id = %(correlation_id)s AND correlation_id IS NOT NULL
ORDER BY tenant_id, service_call_id
LIMIT %(limit)s;

-- name: console_find_id
-- The timers of any tenant with this serviceCallId, without an index of its own: a loose scan of
-- the primary key steps from one tenant to the next (one index probe per tenant), and a key
-- lookup in each. Costs about two probes per tenant, whatever the number of timers.
WITH RECURSIVE tenants(tenant_id) AS (
    (SELECT tenant_id FROM timers ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT t.tenant_id FROM timers t WHERE t.tenant_id > tenants.tenant_id
            ORDER BY t.tenant_id LIMIT 1)
    FROM tenants WHERE tenants.tenant_id IS NOT NULL
)
SELECT t.tenant_id, t.service_call_id, t.state, t.due_at, t.lease_owner, t.lease_expires_at,
       t.attempts, t.last_error, t.fired_count, t.repeat_every, t.correlation_id,
       t.state = 'Scheduled' AND t.due_at <= now() AS overdue
FROM tenants
JOIN timers t ON t.tenant_id = tenants.tenant_id AND t.service_call_id = %(service_call_id)s
ORDER BY t.tenant_id
LIMIT %(limit)s;

-- name: console_tenant_back
-- One tenant's timers in reverse key order, before %(before)s: the console's previous page (and
-- its descending sort); otherwise as inspect_tenant_timers.
SELECT tenant_id, service_call_id, state, due_at, lease_owner, lease_expires_at, attempts,
       last_error, fired_count, repeat_every,
       state = 'Scheduled' AND due_at <= now() AS overdue
FROM timers
WHERE tenant_id = %(tenant_id)s AND service_call_id < %(before)s
  AND (%(state)s::text IS NULL OR state = %(state)s::text)
ORDER BY service_call_id DESC
LIMIT %(limit)s;

-- name: console_due_back
-- One tenant's Scheduled timers in reverse due order, before the key: the previous page of
-- inspect_due_timers (and its descending sort), a range of the due index walked backwards.
SELECT tenant_id, service_call_id, state, due_at, lease_owner, lease_expires_at, attempts,
       last_error, fired_count, repeat_every,
       due_at <= now() AS overdue
FROM timers
WHERE state = 'Scheduled'
  AND (due_at, tenant_id, service_call_id) < (%(before_due)s::timestamptz, %(before_tenant)s, %(before_id)s)
  AND tenant_id = %(tenant_id)s
ORDER BY due_at DESC, tenant_id DESC, service_call_id DESC
LIMIT %(limit)s;

-- Pause and resume (0011; README, Pause and resume). A paused timer is stored Paused: out of the due
-- index, so no claim sees it and claim_due is unchanged. Only rows no lease holds are paused: a
-- claimed occurrence fires, and the timer is paused after it (intake offers the command again).
-- Pausing or resuming clears claimed_at, the recurrence reference, so claim_due applies the downtime
-- rule on resume: a recurring timer paused across occurrences fires once for the missed window (it
-- sat unclaimed longer than TIMER_DOWNTIME_AFTER), a one-shot due meanwhile fires once, late.
-- updated_at is set: retention does not read past a paused row before TIMER_RETENTION has passed.

-- name: lock_tenant
-- A tenant's pause or resume, in the transaction that changes its flag: waits for every intake
-- transaction writing the tenant's timers (lock_tenants_shared), and holds new ones back until the
-- flag is committed. Its keys (the tenant's own and its slot's, worker/adapters/postgres/pausing.py,
-- pause_lock_keys) in the given (ascending) order, as intake takes its own.
SELECT count(pg_advisory_xact_lock(k)) AS n
FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS u(k, i);

-- name: lock_tenants_shared
-- Intake, before it writes ScheduleTimers, in their transaction: the tenants' keys, shared (intake
-- transactions never wait for each other), in the given (sorted) order; no more than
-- pausing.TENANT_LOCKS of them (intake_lock_keys: a batch of many tenants locks their slots). A
-- statement of its own, so the upsert that follows takes its snapshot after any pause or resume of
-- these tenants committed, and reads its flag; and a pause or resume waits until these rows are committed, and visible to
-- the rows it moves (issue 23 review: else a schedule in flight stayed Scheduled under a paused
-- tenant, or Paused under a resumed one, for good).
SELECT count(pg_advisory_xact_lock_shared(k)) AS n
FROM unnest(%(keys)s::bigint[]) WITH ORDINALITY AS u(k, i);

-- name: pause_tenant
-- Record the tenant as paused (%(pause)s) or resumed, unless a command later in the stream already
-- set it (stream position as in upsert_schedules; a redelivered copy is not later than itself).
-- A row when it changed (`first`: this command's first application): new and rescheduled timers of
-- the tenant follow it from its commit on (upsert_schedules).
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
-- One chunk of a paused tenant's Scheduled, unclaimed rows moved to Paused, in key order after
-- %(after)s: a range of the primary key, so chunk after chunk reads each row once. Only while the
-- tenant is still paused (a resume that committed meanwhile wins). SKIP LOCKED: a row a claim or a
-- command holds now is left, and counted by tenant_left_scheduled, so the command comes back for it.
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
-- The paused tenant's rows still Scheduled (claimed occurrences, rows locked as a chunk passed):
-- while any is, the pause is offered again; `claimed`, those a lease holds (or held: a crashed or
-- backing-off claim), `stuck`, those first claimed longer than %(stuck_after)s ago (the pause is
-- then given up as timer_stuck, README, guarantees). Zero when the tenant is no longer paused. A
-- range of the primary key.
SELECT count(*) AS n,
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL) AS claimed,
       count(*) FILTER (WHERE lease_expires_at IS NOT NULL AND claimed_at < now() - %(stuck_after)s::interval) AS stuck
FROM timers
WHERE tenant_id = %(tenant_id)s AND state = 'Scheduled'
  AND EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = %(tenant_id)s AND p.paused_at IS NOT NULL);

-- name: resume_tenant_rows
-- One chunk of the tenant's Paused rows back to Scheduled, in key order after %(after)s, through
-- timers_paused; those paused one by one (paused_at) stay paused. Only while the tenant is not paused
-- again. RETURNING their dueAt: intake wakes the firing loops for the soonest.
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
-- The resumed tenant's rows still Paused that its resume should have moved (locked as a chunk
-- passed): zero when the tenant is paused again. No lease holds a Paused row: claimed and stuck are
-- 0 (the columns of tenant_left_scheduled).
SELECT count(*) AS n, 0 AS claimed, 0 AS stuck FROM timers
WHERE tenant_id = %(tenant_id)s AND state = 'Paused' AND paused_at IS NULL
  AND NOT EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = %(tenant_id)s AND p.paused_at IS NOT NULL);

-- name: pause_timer
-- Pause one timer (Scheduled or already Paused with its tenant). A claimed occurrence whose lease
-- is committed (a publish backing off) fires: the row stays Scheduled, its claim untouched, with
-- paused_at recorded, so its mark stores the next occurrence Paused (mark_fired): `applied`. A
-- claim's batch in flight holds the row (FOR NO KEY UPDATE, claim_due) with its lease not yet
-- visible: `claimed`, the command waits for that occurrence to be recorded. Locked as lock_keys
-- does (it waits for a batch of commands, not for a claim), so the pause never waits for a batch
-- that a rollback after its PubAck would leave looking unfired.
-- Stream order (0013): a pause earlier in the stream than the timer's last pause or resume
-- (control_seq, control_stored_at; compared as command_seq in upsert_schedules) changes nothing, so
-- a pause deferred behind a claim never undoes the resume sent after it. Every pause that reaches
-- the row records its position, a finished timer's too (a ScheduleTimer may bring it back). Not
-- command_seq: a deferred ScheduleTimer older than a pause still applies.
WITH s AS MATERIALIZED (
    SELECT 1 FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id = %(service_call_id)s
    FOR KEY SHARE
), k AS MATERIALIZED (
    SELECT state FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id = %(service_call_id)s AND EXISTS (SELECT FROM s)
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
        control_seq = coalesce(%(control_seq)s::bigint, t.control_seq),
        control_stored_at = coalesce(%(control_stored_at)s::timestamptz, t.control_stored_at)
    WHERE t.tenant_id = %(tenant_id)s AND t.service_call_id = %(service_call_id)s
      AND EXISTS (SELECT FROM k)  -- only a row this statement holds: never waits for a claim
      AND (t.state IN ('Scheduled', 'Paused') OR %(control_seq)s::bigint IS NOT NULL)  -- else nothing to write
      AND (%(control_seq)s::bigint IS NULL OR t.control_seq IS NULL OR t.control_stored_at IS NULL
           OR %(control_seq)s::bigint >= t.control_seq OR %(control_stored_at)s::timestamptz > t.control_stored_at)
    RETURNING t.state IN ('Scheduled', 'Paused') AS pending
)
SELECT EXISTS (SELECT FROM u WHERE u.pending) AS applied, NULL::timestamptz AS due_at,
       EXISTS (SELECT FROM s) AND NOT EXISTS (SELECT FROM k) AS claimed;

-- name: resume_timer
-- End one timer's own pause: Scheduled again, unless its tenant is paused (then it stays Paused and
-- the tenant's resume frees it). `applied` and, when it is claimable again, its dueAt. Only a pending
-- timer: a replica of the release before 0011 leaves paused_at on the rows it cancels or un-pauses
-- (and then fires), and resuming those would bring a Cancelled or Reached timer back to fire.
-- A claimed one (paused as its occurrence was claimed, pause_timer) keeps its claim and state.
-- Stream order as in pause_timer: an older resume changes nothing; one that finds nothing paused
-- still records its position (the pause before it, deferred, may come back after it). Locked as
-- pause_timer: a row a claim's batch in flight holds is `claimed`, and the resume waits for that
-- occurrence to be recorded (offered again) rather than hold intake up, or record its position
-- on a row whose claim may yet roll back.
WITH s AS MATERIALIZED (
    SELECT 1 FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id = %(service_call_id)s
    FOR KEY SHARE
), k AS MATERIALIZED (
    SELECT paused_at IS NOT NULL AND state IN ('Scheduled', 'Paused') AS live FROM timers
    WHERE tenant_id = %(tenant_id)s AND service_call_id = %(service_call_id)s AND EXISTS (SELECT FROM s)
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE timers t SET
        state = CASE WHEN NOT k.live OR t.lease_expires_at IS NOT NULL THEN t.state
                     WHEN EXISTS (SELECT FROM paused_tenants p WHERE p.tenant_id = t.tenant_id AND p.paused_at IS NOT NULL)
                     THEN 'Paused' ELSE 'Scheduled' END,
        paused_at = CASE WHEN k.live THEN NULL ELSE t.paused_at END,
        claimed_at = CASE WHEN NOT k.live OR t.lease_expires_at IS NOT NULL THEN t.claimed_at END,
        updated_at = CASE WHEN k.live THEN now() ELSE t.updated_at END,
        control_seq = coalesce(%(control_seq)s::bigint, t.control_seq),
        control_stored_at = coalesce(%(control_stored_at)s::timestamptz, t.control_stored_at)
    FROM k
    WHERE t.tenant_id = %(tenant_id)s AND t.service_call_id = %(service_call_id)s
      AND (k.live OR %(control_seq)s::bigint IS NOT NULL)  -- else nothing to write
      AND (%(control_seq)s::bigint IS NULL OR t.control_seq IS NULL OR t.control_stored_at IS NULL
           OR %(control_seq)s::bigint >= t.control_seq OR %(control_stored_at)s::timestamptz > t.control_stored_at)
    RETURNING k.live AS applied, CASE WHEN k.live AND t.state = 'Scheduled' THEN t.due_at END AS due_at
)
SELECT coalesce((SELECT u.applied FROM u), false) AS applied, (SELECT u.due_at FROM u) AS due_at,
       EXISTS (SELECT FROM s) AND NOT EXISTS (SELECT FROM k) AS claimed;

-- name: paused_gauges
-- The timer_paused and timer_paused_tenants gauges: paused timers counted up to %(cap)s through
-- timers_paused (a huge paused tenant stays cheap to count), and the paused tenants.
SELECT (SELECT count(*) FROM (SELECT 1 FROM timers WHERE state = 'Paused' LIMIT %(cap)s) AS p) AS paused,
       (SELECT count(*) FROM paused_tenants WHERE paused_at IS NOT NULL) AS tenants;

-- name: status_paused
-- `status`: paused timers per tenant (timers_paused) and the paused tenants with when; at most %(top)s.
SELECT coalesce(c.tenant_id, p.tenant_id) AS tenant_id, coalesce(c.n, 0) AS paused, p.paused_at
FROM (SELECT tenant_id, count(*) AS n FROM timers WHERE state = 'Paused' GROUP BY tenant_id) AS c
FULL JOIN (SELECT * FROM paused_tenants WHERE paused_at IS NOT NULL) p ON p.tenant_id = c.tenant_id
ORDER BY coalesce(c.n, 0) DESC, 1
LIMIT %(top)s;

-- name: tenant_paused
-- Whether one tenant is paused, and since when (`status --tenant`, describe, the console).
SELECT paused_at FROM paused_tenants WHERE tenant_id = %(tenant_id)s AND paused_at IS NOT NULL;

-- name: ping
-- Readiness (adapters/postgres/pinger.py): the server answers. Reads nothing, so it answers on a read-only
-- server too; the store's last write error says whether writes go through.
SELECT 1;
