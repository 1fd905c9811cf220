"""The Postgres adapter: every statement a replica runs, named in sql/queries/.

db.py           the one place a connection is opened, with its session pins; the fleet secret
store.py        every call a replica makes but the claim's: intake's writes, reads, the quota
columns.py      upsert_schedules' array parameters
claim.py        a claim's transaction, open from the claim to its record
pausing.py      a tenant's or timers' pauses and resumes
bulk.py         a bulk action's next chunk of the timers a label selector names
pgerrors.py     `classify`: a Postgres error worth retrying or not
queries.py      the named SQL of sql/queries/, loaded once
migrations.py   sql/migrations, applied safely when replicas run them at once
pinger.py       readiness's own connection, beside the pool
stats.py        the replica's minute stats, what the console charts
writes.py       the writes in flight, so readiness tells a stalled primary from a slow one
"""
