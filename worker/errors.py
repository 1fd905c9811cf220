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
    """Postgres refused in a way retrying will not fix: the replica stops with this one line."""


# What a failure outside the process means for the loop that met it.
Verdict = Literal["transient", "alone", "fatal"]

# What says "failing for now"; adapters add their libraries' errors, so this imports none.
_transient: tuple[type[BaseException], ...] = (TransientError, OSError, TimeoutError)


def count_as_transient(*kinds: type[BaseException]) -> None:
    """From now on, `verdict` calls these exceptions (and their subclasses) transient."""
    global _transient
    _transient = (*_transient, *(k for k in kinds if k not in _transient))


def verdict(exc: BaseException) -> Verdict:
    """transient: a dependency is failing for now: back off and retry. alone: the row or message
    in hand is bad: set it aside, go on. fatal: no retry fixes it: the replica stops."""
    if isinstance(exc, (ConfigError, DatabaseError)):
        return "fatal"
    if isinstance(exc, _transient):
        return "transient"
    return "alone"
