"""Tools around the service, never imported by it; the tests and benchmarks use them too.

embedded.py     throwaway Postgres and NATS JetStream
process.py      a server as a child process that cannot outlive us
harness.py      replicas as real processes
recorder.py     the recorder of what a fleet publishes
dev.py          `timer-service dev`
polling.py      poll until, with a deadline
schema.py       sql/schema.sql from the migrations
"""
