"""nats-py's errors as the core judges them: every one of them means NATS is failing for now
(reconnecting, refusing, slow), retried with back-off, nothing acknowledged or marked. Registered
with errors.verdict on import, which the package's __init__ does before any of its modules runs."""

from __future__ import annotations

import nats.errors

from worker.errors import count_as_transient

count_as_transient(nats.errors.Error)
