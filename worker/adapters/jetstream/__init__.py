"""NATS JetStream behind the ports: the broker, its publisher, the streams, the pull, the batch probe."""

from worker.adapters.jetstream import errors as errors  # nats-py's errors judged transient from here on
