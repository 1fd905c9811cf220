"""The few exception classes callers need to tell apart."""


class TimerServiceError(Exception):
    """Base of this package's errors."""


class ConfigError(TimerServiceError):
    """A setting is missing or wrong; the message is one line naming it."""


class TransientError(TimerServiceError):
    """A dependency (Postgres, NATS) failed in a way worth retrying."""


class DatabaseError(TimerServiceError):
    """Postgres refused in a way retrying will not fix (schema missing, permission denied): the
    replica stops with this one line, which names the problem."""
