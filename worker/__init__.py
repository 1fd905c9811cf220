"""timer-service: durable multi-tenant timers on Postgres and NATS JetStream.

Its rooms, and the arrows between them that tests/unit/test_layout.py enforces: CONTRIBUTING.md.

contract.py     the wire contract: subjects, commands, Repeat, reason codes, limits, DueTimeReached,
                the read model's view of a timer; pure (standard library only, no I/O, no settings)
client/         the producer client (TimerClient): imports only contract.py, itself and nats-py
core/           the loops and what they depend on: no adapter, neither psycopg nor nats-py
adapters/       the outside world behind the core's ports: Postgres, JetStream, the HTTP server
service.py      the composition root: one replica, the adapters wired into the core's loops,
                supervised, with a soft then hard stop
settings.py     the settings every entry point loads: config's, the database URL checked by the
                Postgres adapter (composition: config.py, which the core reads, imports no driver)
config.py       Settings: every TIMER_* variable, read once and validated (cross-cutting)
errors.py       the exceptions callers tell apart, and the verdict on any failure (cross-cutting)
logs.py         structured logs, one JSON object a line with a stable `action` (cross-cutting)
metrics.py      the Prometheus metrics, documented in docs/OPERATIONS.md (cross-cutting)
tracing.py      the OpenTelemetry spans of intake, claim, publish and mark; the traceparent rule
                (cross-cutting)
ops/            the operator's tools (the `timer-service` command, the console); never imported
                by the service
devkit/         throwaway servers, replicas as processes, the recorder, `timer-service dev`
__main__.py     `python -m worker`: the `timer-service` command where the script is not on PATH
"""

from importlib.metadata import PackageNotFoundError, version

try:
    # pyproject.toml is the one place the version is written; the installed metadata carries it.
    __version__ = version("timer-service")
except PackageNotFoundError:  # a source tree on sys.path, never installed
    __version__ = "0+unknown"
