-- The tenant quota's bound (README, Tenant quota): for each tenant, a number never below its
-- pending timers (Scheduled or Paused), kept by Postgres itself beside the rows, so the quota reads
-- a few rows per tenant instead of walking the tenant's range of the primary key (at 5M rows and
-- 1,000 tenants that walk cost intake 94% of its speed).
--
-- Only what makes a timer pending is counted: a row inserted Scheduled or Paused, a row updated
-- into either state from another. What ends one (a firing, a cancel, a delete) is not: the firing
-- path writes timers at every fire, and counting there (statement triggers with transition tables
-- on every UPDATE) cost Postgres 26% more CPU per fire (docs/BENCHMARKS.md). So the number only
-- grows, and is an upper bound whoever writes (this release, the one before it during a rollout,
-- an operator: a delete or a TRUNCATE lowers the real count, never above the bound). A tenant whose
-- bound leaves no room for a batch's new timers is counted exactly (quota_recount, queries.sql),
-- which also brings its bound down to that count: only an exact count ever refuses a command.
--
-- tenant_pending holds deltas, never updated in place: a statement adds one row per tenant it
-- counted, and a tenant's bound is the sum of its rows. Adding a row locks nothing another writer
-- waits for: two replicas taking the same tenant's commands never queue on one counter row (nor
-- deadlock over two). Replicas fold a tenant's rows into one now and then (compact_pending,
-- queries.sql): a delete and an insert of their sum in one statement, which every snapshot sees
-- whole. A new table: no lock on anything the old release uses.
CREATE TABLE tenant_pending (
    tenant_id text   NOT NULL,
    pending   bigint NOT NULL
);
CREATE INDEX tenant_pending_tenant ON tenant_pending (tenant_id) INCLUDE (pending);
ALTER TABLE tenant_pending SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 1);

-- Inserts, one statement at a time: intake inserts thousands of rows per statement, and one
-- INSERT ... SELECT over its transition table costs less than a call per row. The firing path
-- never inserts.
CREATE FUNCTION timers_count_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_pending (tenant_id, pending)
    SELECT tenant_id, count(*) FROM new_rows WHERE state IN ('Scheduled', 'Paused') GROUP BY tenant_id;
    RETURN NULL;
END
$$;

-- Updates into a pending state, one row at a time, chosen by the trigger's WHEN: Postgres tests it
-- on each updated row without calling anything, so a claim or a record (Scheduled to Reached,
-- Scheduled to Scheduled) costs that test alone. What passes is rare: a cancelled timer scheduled
-- again, a one-shot occurrence a claim recorded fired and put back (retry_later: a failed publish,
-- a stop), an operator's change.
CREATE FUNCTION timers_count_revived() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO tenant_pending (tenant_id, pending) VALUES (NEW.tenant_id, 1);
    RETURN NULL;
END
$$;

-- CREATE TRIGGER takes SHARE ROW EXCLUSIVE on timers until this file commits: waited for 100 ms at
-- a time by the runner, and then held only for these statements (the counts are made in 0015).
CREATE TRIGGER timers_pending_insert AFTER INSERT ON timers REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION timers_count_inserted();
CREATE TRIGGER timers_pending_revive AFTER UPDATE ON timers FOR EACH ROW
    WHEN (OLD.state NOT IN ('Scheduled', 'Paused') AND NEW.state IN ('Scheduled', 'Paused'))
    EXECUTE FUNCTION timers_count_revived();
