"""timer-service: durable multi-tenant timers on Postgres and NATS JetStream (rooms: CONTRIBUTING.md).

contract.py     the wire contract; pure (standard library only)
client/         the producer client (TimerClient)
core/           the loops and their ports: no adapter
adapters/       Postgres, JetStream, the HTTP server
service.py      the composition root: one replica
settings.py     the settings every entry point loads
config.py       every TIMER_* variable, validated
errors.py       the exceptions callers tell apart, and the verdict on a failure
logs.py         structured logs
metrics.py      the Prometheus metrics
tracing.py      the OpenTelemetry spans
ops/            the operator's tools; never imported by the service
devkit/         throwaway servers, replicas as processes, the recorder, `timer-service dev`
__main__.py     `python -m worker`
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("timer-service")
except PackageNotFoundError:  # never installed
    __version__ = "0+unknown"
