-- Half of each new heap page stays free. A claim leases up to a thousand neighbouring rows at
-- once (they were stored in due order, so they share pages), and an update is HOT only when
-- its new version fits on the same page: at fillfactor 80 about one claim update in nine was
-- HOT, at 50 about four in ten, and a claim plus its record cost a third less database time
-- (docs/BENCHMARKS.md). Existing pages keep their layout until rewritten.
ALTER TABLE timers SET (fillfactor = 50);
