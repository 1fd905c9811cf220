"""Adapters: the outside world behind the core's ports. They import the core's types, never the
reverse, and translate their library's errors so that the core needs neither library.

postgres/       Postgres: the connection, the store, the claim, the named SQL, the migrations
jetstream/      NATS JetStream: the broker, its publisher, the streams, the pull, the batch probe
http_server.py  a replica's HTTP server: /healthz, /readyz and /metrics
"""
