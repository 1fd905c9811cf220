"""timer-service: durable multi-tenant timers on Postgres and NATS JetStream."""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml is the one place the version is written; the installed metadata carries it.
    __version__ = version("timer-service")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
