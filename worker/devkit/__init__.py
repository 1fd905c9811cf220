"""Tools around the service, never imported by it. The tests, the chaos suite and the benchmarks
(tools/bench, in the repository only) use them too.

embedded.py     throwaway real servers: Postgres and NATS JetStream from the `embedded` extra
process.py      a server as a child process that cannot outlive us
harness.py      replicas as real processes, and what they fired in sum
recorder.py     the one recorder of what a fleet publishes (dev, bench, tests, chaos)
dev.py          `timer-service dev`: the whole service on one machine with a demo load
polling.py      the one poll-until (sync and async, a deadline, what it waited for)
schema.py       sql/schema.sql from the migrations (`make schema`)
"""
