-- The tenant quota's count (README, Tenant quota): each tenant's pending timers (Scheduled or
-- Paused), kept by Postgres itself beside the rows, so the quota reads a few rows per tenant
-- instead of walking the tenant's range of the primary key (at 5M rows and 1,000 tenants that
-- walk cost intake 94% of its speed).
--
-- tenant_pending holds deltas, never updated in place: each statement that changes how many timers
-- of a tenant are pending adds one row per such tenant (+n, -n), and a tenant's count is the sum of
-- its rows. Adding a row locks nothing another writer waits for: two replicas taking the same
-- tenant's commands, or a claim's marks beside them, never queue on one counter row (nor deadlock
-- over two). Replicas fold a tenant's rows into one now and then (compact_pending, queries.sql):
-- a delete and an insert of their sum in one statement, which every snapshot sees whole.
-- A new table: no lock on anything the old release uses.
CREATE TABLE tenant_pending (
    tenant_id text   NOT NULL,
    pending   bigint NOT NULL
);
CREATE INDEX tenant_pending_tenant ON tenant_pending (tenant_id) INCLUDE (pending);
ALTER TABLE tenant_pending SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_cost_delay = 1);

-- Statement triggers with transition tables: one INSERT ... SELECT per statement on timers, whoever
-- runs it (this release, the one before it during a rollout, an operator), so no write path can
-- forget the count. An update's delta is its new rows' pending count less its old rows', per tenant;
-- a claim or a mark of a recurring timer changes no state, sums to zero and adds nothing.
CREATE FUNCTION timers_count_pending() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tenant_pending (tenant_id, pending)
        SELECT tenant_id, count(*) FROM new_rows WHERE state IN ('Scheduled', 'Paused') GROUP BY tenant_id;
    ELSIF TG_OP = 'DELETE' THEN
        INSERT INTO tenant_pending (tenant_id, pending)
        SELECT tenant_id, -count(*) FROM old_rows WHERE state IN ('Scheduled', 'Paused') GROUP BY tenant_id;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO tenant_pending (tenant_id, pending)
        SELECT tenant_id, sum(d)
        FROM (SELECT tenant_id, 1 AS d FROM new_rows WHERE state IN ('Scheduled', 'Paused')
              UNION ALL
              SELECT tenant_id, -1 FROM old_rows WHERE state IN ('Scheduled', 'Paused')) AS c
        GROUP BY tenant_id
        HAVING sum(d) <> 0;
    ELSE  -- TRUNCATE: no timer left, none pending
        DELETE FROM tenant_pending;
    END IF;
    RETURN NULL;
END
$$;

-- CREATE TRIGGER takes SHARE ROW EXCLUSIVE on timers until this file commits: waited for 100 ms at
-- a time by the runner, and then held only for these statements (the counts are made in 0015).
CREATE TRIGGER timers_pending_insert AFTER INSERT ON timers REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION timers_count_pending();
CREATE TRIGGER timers_pending_update AFTER UPDATE ON timers
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION timers_count_pending();
CREATE TRIGGER timers_pending_delete AFTER DELETE ON timers REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION timers_count_pending();
CREATE TRIGGER timers_pending_truncate AFTER TRUNCATE ON timers
    FOR EACH STATEMENT EXECUTE FUNCTION timers_count_pending();
