"""What TimerClient.get raises; each also subclasses nats-py's or Python's error for it."""

from __future__ import annotations

import nats.errors


class TimerClientError(Exception):
    """Any failure a TimerClient call names."""


class GetTimeout(TimerClientError, nats.errors.TimeoutError):
    """No reply within `get`'s timeout: the replicas are busy or away, or NATS is slow."""

    def __str__(self) -> str:
        return "get: no reply within the timeout (nats: timeout)"


class NoReplica(TimerClientError, nats.errors.NoRespondersError):
    """Nothing listens on the tenant's get subject: no replica runs, or it uses another prefix."""

    def __str__(self) -> str:
        return "get: no replica answers on this subject (nats: no responders available for request)"


class GetRefused(TimerClientError, RuntimeError):
    """The service answered with an error (docs/CONTRACT.md, Read model): `code` (`bad_request`,
    `unavailable`) and `detail`."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail
