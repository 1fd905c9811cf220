"""The few exception classes callers need to tell apart."""


class TimerServiceError(Exception):
    """Base of this package's errors."""


class ConfigError(TimerServiceError):
    """A setting is missing or wrong; the message is one line naming it."""


class TransientError(TimerServiceError):
    """A dependency (Postgres, NATS) failed in a way worth retrying."""
