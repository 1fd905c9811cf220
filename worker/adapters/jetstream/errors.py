"""nats-py's errors as transient (NATS failing for now: retried with back-off), registered on import,
which the package's __init__ does first."""

from __future__ import annotations

import nats.errors

from worker.errors import count_as_transient

count_as_transient(nats.errors.Error)
