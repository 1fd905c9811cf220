-- migration: no-transaction
-- The console's history and its search (docs/OPERATIONS.md, The console).
--
-- timer_stats: each replica adds its counters of the current minute every 15 s (worker/adapters/
-- stats.py): occurrences fired, commands rejected, the fleet's overdue count as it last saw it,
-- and its lateness histogram's firings per bucket (not cumulative, bounds beside them so that a
-- release with other buckets still adds up). The console draws its charts from it and lists the
-- replicas that wrote lately (alive, whether they hold leases or not). Replicas delete rows
-- older than 7 days. A new table: no lock on anything the old release uses.
-- Each statement stands alone (no transaction, for the index below) and can run again: the
-- runner retries a file whose index build waited too long.
CREATE TABLE IF NOT EXISTS timer_stats (
    minute      timestamptz        NOT NULL,
    worker_id   text               NOT NULL,
    fired       bigint             NOT NULL DEFAULT 0,
    rejected    bigint             NOT NULL DEFAULT 0,
    overdue     bigint             NOT NULL DEFAULT 0,
    lateness_le double precision[] NOT NULL,
    lateness    bigint[]           NOT NULL,
    written_at  timestamptz        NOT NULL DEFAULT now(),
    PRIMARY KEY (minute, worker_id)
);

-- The console's search by correlationId, across tenants. Partial: timers without one (and their
-- inserts) cost nothing here; the lease columns a claim and a record change are not in it, so those
-- updates stay HOT.
DROP INDEX CONCURRENTLY IF EXISTS timers_correlation;
CREATE INDEX CONCURRENTLY timers_correlation ON timers (correlation_id)
    WHERE correlation_id IS NOT NULL;
