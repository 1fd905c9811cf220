"""The few exception classes callers need to tell apart, and the verdict on any failure."""

from __future__ import annotations

from typing import Literal


class TimerServiceError(Exception):
    """Base of this package's errors."""


class ConfigError(TimerServiceError):
    """A setting is missing or wrong; the message is one line naming it."""


class TransientError(TimerServiceError):
    """A dependency (Postgres, NATS) failed in a way worth retrying."""


class DatabaseError(TimerServiceError):
    """Postgres refused in a way retrying will not fix (schema missing, permission denied): the
    replica stops with this one line, which names the problem."""


# What a failure outside the process (a database session, a NATS call, a row, a message) means for
# the loop that met it; `verdict` is the one place that decides it (README, "Database trouble").
Verdict = Literal["transient", "alone", "fatal"]

# What says "failing for now". An adapter whose client library raises errors of its own, and hands
# the core objects that raise them (nats-py's messages, acknowledged by intake), adds them when it
# is imported (worker/adapters/jetstream/errors.py): this module, and the core judging with it,
# import no client library.
_transient: tuple[type[BaseException], ...] = (TransientError, OSError, TimeoutError)


def count_as_transient(*kinds: type[BaseException]) -> None:
    """From now on, `verdict` calls these exceptions (and their subclasses) transient."""
    global _transient
    _transient = (*_transient, *(k for k in kinds if k not in _transient))


def verdict(exc: BaseException) -> Verdict:
    """transient: a dependency is failing for now (NATS reconnecting or refusing, Postgres
    unreachable or read-only, a timeout): back off and retry, nothing acknowledged or marked.
    alone: the data in hand is bad (a row or a message whose values break the code reading
    them): that row or message is recorded and set aside; the loop goes on. fatal: the setting or
    the database is wrong in a way no retry fixes: the replica stops with one line naming it."""
    if isinstance(exc, (ConfigError, DatabaseError)):
        return "fatal"
    if isinstance(exc, _transient):
        return "transient"
    return "alone"
