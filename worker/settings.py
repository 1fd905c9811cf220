"""The settings every entry point loads: config's, and the database URL checked by libpq, which
config.py (read by the core) cannot import."""

from __future__ import annotations

from typing import Any

from worker.adapters.postgres.db import conninfo_fault
from worker.config import ConsoleSettings, S, Settings, build
from worker.errors import ConfigError


def load_settings(**overrides: Any) -> Settings:
    """Build settings from the environment (and overrides); a bad one raises ConfigError, one line."""
    return _database_checked(build(Settings, overrides))


def load_console_settings(**overrides: Any) -> ConsoleSettings:
    """The console's settings, checked the same way."""
    return _database_checked(build(ConsoleSettings, overrides))


def _database_checked(settings: S) -> S:
    if (fault := conninfo_fault(settings.database_url.get_secret_value())) is not None:
        raise ConfigError(f"TIMER_DATABASE_URL: not a PostgreSQL URL or conninfo ({fault})")
    return settings
