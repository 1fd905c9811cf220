"""What TimerClient.get raises, so that a caller can tell its failures apart.

Each kind also subclasses what `get` raised before it had them (nats-py's TimeoutError, which is
also the builtin TimeoutError, and NoRespondersError; RuntimeError for an error reply), so an
`except` written against those keeps catching it.
"""

from __future__ import annotations

import nats.errors


class TimerClientError(Exception):
    """A failure of a TimerClient call that the client names: catch this for any of them."""


class GetTimeout(TimerClientError, nats.errors.TimeoutError):
    """No reply within `get`'s timeout: the replicas are busy or away, or NATS is slow."""

    def __str__(self) -> str:
        return "get: no reply within the timeout (nats: timeout)"


class NoReplica(TimerClientError, nats.errors.NoRespondersError):
    """Nothing listens on the tenant's get subject: no replica runs, or it uses another prefix."""

    def __str__(self) -> str:
        return "get: no replica answers on this subject (nats: no responders available for request)"


class GetRefused(TimerClientError, RuntimeError):
    """The service answered with an error instead of a timer (docs/CONTRACT.md, Read model):
    `code` is its reason (`bad_request`, `unavailable`), `detail` what it said of it."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")  # the message get's RuntimeError carried
        self.code = code
        self.detail = detail
