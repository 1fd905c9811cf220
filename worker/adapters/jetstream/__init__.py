"""NATS JetStream behind the ports; nats-py's errors are judged transient from the import on.

broker.py       the connection, readiness, the streams' upkeep, the command subscription
publisher.py    publishing: one by one, atomic and fast-ingest batches
streams.py      the streams, their limits, the shared consumer, a cut-over and the purge
pull.py         how intake pulls commands: one request per fetch into a buffer
probe.py        whether fast-ingest batches are the cheaper on this server
options.py      nats.connect()'s options for the settings
errors.py       nats-py's errors judged transient
"""

from worker.adapters.jetstream import errors as errors
