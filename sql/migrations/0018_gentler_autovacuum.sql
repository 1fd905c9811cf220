-- A gentler autovacuum for timers: a cost delay of 5 ms instead of 0001's 1 ms. Most of each
-- autovacuum of a big table is its pass over the indexes (their size sets its length, not the dead
-- rows): at 1 ms it read 600 MB in 3 s and took a core from the claims beside it, and 10 of the
-- soak's 12 windows over a p99 of 50 ms held one. At 5 ms the same pass takes 6 s, once a
-- minute, the dead rows and sizes stay the same, and no window with one went over 50 ms
-- (docs/BENCHMARKS.md, The soak).
--
-- Only where the table still holds 0001's value: an operator who set another one keeps it.
-- SHARE UPDATE EXCLUSIVE on timers: no read or write waits for it.
DO $$
BEGIN
    IF EXISTS (
        SELECT FROM pg_class c, pg_options_to_table(c.reloptions) o
        WHERE c.oid = 'timers'::regclass
          AND o.option_name = 'autovacuum_vacuum_cost_delay' AND o.option_value = '1'
    ) THEN
        ALTER TABLE timers SET (autovacuum_vacuum_cost_delay = 5);
    END IF;
END
$$;
