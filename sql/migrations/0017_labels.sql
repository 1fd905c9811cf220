-- migration: no-transaction
-- Issue 35: labels on a timer, and cancel, pause and resume of every timer a label selector names
-- (docs/CONTRACT.md, Labels).
-- Each statement stands alone (no transaction, for CONCURRENTLY) and can run again: a half-built
-- index of the same name is dropped first.

-- labels: the ScheduleTimer's `labels`, an object of string pairs (NULL: none). Nullable without a
-- default: no rewrite of the table, one brief ACCESS EXCLUSIVE lock.
ALTER TABLE timers ADD COLUMN IF NOT EXISTS labels jsonb;

-- A row's labels as the terms a selector matches, each `<tenant>:<key>=<value>` (a tenant has no
-- `:`, a key no `=`: one term, one pair of one tenant). Keyed by tenant in the term itself, so a
-- selector reads the entries of its tenant's pair and of nothing else: a GIN index on the labels
-- alone holds one entry per pair for every tenant, and the planner took the tenant's primary key
-- range instead and filtered 1,000,000 rows for a rare pair (docs/SQL.md, select_labelled).
CREATE OR REPLACE FUNCTION timer_label_terms(tenant_id text, labels jsonb) RETURNS text[] LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT AS $$ SELECT array_agg(tenant_id || ':' || key || '=' || value) FROM jsonb_each_text(labels) $$;

DROP INDEX CONCURRENTLY IF EXISTS timers_labels;
CREATE INDEX CONCURRENTLY timers_labels ON timers USING gin (timer_label_terms(tenant_id, labels)) WHERE labels IS NOT NULL;

-- What the planner knows of the terms: a GIN index's own statistics are of its stored elements, not
-- of the arrays, so the planner took every pair for a default 0.5 % of the table and read a common
-- pair through the index, all of it, for each chunk. Statistics on the expression itself (of type
-- text[]: the most common terms and their frequencies) let it tell a rare pair from a common one.
-- Filled by the next ANALYZE of timers (autovacuum's). SHARE UPDATE EXCLUSIVE: no write waits.
CREATE STATISTICS IF NOT EXISTS timers_label_terms ON (timer_label_terms(tenant_id, labels)) FROM timers;
