"""Adapters: the outside world behind the core's ports. They import the core, never the reverse,
and translate their library's errors.

postgres/       Postgres: the connection, the store, the claim, the SQL, the migrations
jetstream/      NATS JetStream: the broker, the publisher, the streams, the pull
http_server.py  a replica's HTTP server: /healthz, /readyz and /metrics
"""
