"""Operator tools: the `timer-service` command, the reads behind it, the DLQ, the web console. The
service never imports them.

cli.py          the `timer-service` command (also `python -m worker`): the parser and main
cli_args.py     its argument types, each refusing a bad value in one line
cli_timers.py   its commands on timers: schedule, cancel, status, list, describe, pause, resume
cli_import.py   `schedule --from-file` and `cancel --from-file`: a file checked line by line, sent in batches
cli_dlq.py      its `dlq` commands: list, show, replay, purge
cli_service.py  its commands that run something: migrate, run, console, dev, bench
cli_nats.py     how those commands reach NATS: once, giving up at once when it is not there
cli_output.py   what they print: a line for people, or the same answer as camelCase JSON (--json)
reads.py        status, list, describe, the cancel outcome: what the database says
cursors.py      the paging cursors of list and the console: opaque, checked against their listing's key
diagnosis.py    a timer's `why`, from its row alone; the timers-by-state line of `status`
browse.py       the console's browsing: a tenant's timers page by page, the search
tenants.py      every tenant, a page at a time, by name or by pending timers, searched by prefix
fleet_stats.py  the fleet over time, from the replicas' minute stats
dlq.py          rejected commands: list, show, replay, purge
history.py      a timer's firings, from the events stream
fleet.py        the command backlog and the replicas taking commands: what NATS says
stream_migration.py  `migrate-streams`: a work-queue command stream cut over to a limits one
consumers.py    `consumer add --tenant`: the consumers a tenant reads, provisioned for it
console/        the web console
"""
