"""The Postgres adapter: the one place a connection is opened (db), the store the loops use
(store: intake's writes, reads; claim: a claim's transaction from the claim to its record; pausing),
how an error is judged (pgerrors), the named SQL (queries, sql/queries/), the migrations, readiness's
ping (pinger), the minute stats (stats) and the writes in flight (writes)."""
