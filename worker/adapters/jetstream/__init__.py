"""NATS JetStream behind the ports; nats-py's errors are judged transient from the import on.

broker.py       the connection, readiness, the streams' upkeep, the command subscription
publisher.py    publishing: one by one with bounded pipelining, atomic and fast-ingest batches
streams.py      the streams as the service makes them, the limits they must keep, the shared
                consumer, the command stream after a cut-over and its purge
pull.py         how intake pulls commands: one request per fetch, a callback fills a buffer
probe.py        whether fast-ingest batches are the cheaper on this server, measured
options.py      nats.connect()'s options for the settings: credentials, TLS, reconnects
errors.py       nats-py's errors as errors.verdict judges them: transient, retried
"""

from worker.adapters.jetstream import errors as errors  # nats-py's errors judged transient from here on
