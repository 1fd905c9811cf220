"""The Postgres adapter: every statement a replica runs, named in sql/queries/.

db.py           the one place a database connection is opened, with every session pin
                (TimeZone=UTC, client_encoding=UTF8, the timestamptz loaders, autocommit), the
                UTF8 check at start-up, the one read of the fleet secret, the conninfo check
store.py        every call a replica makes but the claim's: intake's writes, reads, the quota
columns.py      upsert_schedules' array parameters, a column per field of a batch's schedules
claim.py        a claim's transaction, open from the claim to its record, its rows read by name
pausing.py      a tenant's or timers' pauses and resumes
bulk.py         a bulk action's selection: the next chunk of the timers a label selector names
pgerrors.py     `classify`: a Postgres error worth retrying or not
queries.py      the named SQL of sql/queries/, loaded once
migrations.py   sql/migrations, applied safely when replicas run them at once
pinger.py       readiness's own connection, beside the pool
stats.py        the replica's minute stats (table timer_stats), what the console charts
writes.py       the writes in flight, so readiness tells a stalled primary from a slow one
"""
