"""Adapters: Postgres (store, named queries, migrations, the one place a connection is opened),
NATS JetStream (broker) and the replica's HTTP probes. They import the core's types, never the reverse."""
