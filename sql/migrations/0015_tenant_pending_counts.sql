-- The bounds of the timers stored before 0014's triggers (README, Tenant quota): one statement, so
-- one snapshot, with no lock a write waits for (it reads timers under ACCESS SHARE, however long
-- the count takes). Writes go on meanwhile and their triggers add deltas: those this snapshot sees
-- are in its count too, so they are taken off again; those it does not see are not in it, and stay.
-- Any moment's sum is then at least each tenant's pending timers (exactly, until a timer ends).
-- The same reasoning as quota_recount's (queries.sql), which does this for one tenant at a time.
-- Every writer waited for 0014's lock, so none wrote without its trigger.
INSERT INTO tenant_pending (tenant_id, pending)
SELECT tenant_id, sum(n)
FROM (SELECT tenant_id, count(*) AS n FROM timers WHERE state IN ('Scheduled', 'Paused') GROUP BY tenant_id
      UNION ALL
      SELECT tenant_id, -sum(pending) FROM tenant_pending GROUP BY tenant_id) AS c
GROUP BY tenant_id
HAVING sum(n) <> 0;
