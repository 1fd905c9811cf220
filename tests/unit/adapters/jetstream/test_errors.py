"""nats-py's errors are judged in the JetStream adapter: the core's verdict module imports no
client library, and once the adapter is loaded every nats-py error is transient, as before."""

from __future__ import annotations

import subprocess
import sys

import nats.errors
import nats.js.errors
import pytest

import worker.adapters.jetstream  # noqa: F401  # registers nats-py's errors
from worker.errors import verdict


def test_the_verdict_module_loads_no_client_library() -> None:
    code = "import sys, worker.errors; print(sorted({m.partition('.')[0] for m in sys.modules} & {'nats'}))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "exc",
    [
        nats.errors.NoRespondersError(),
        nats.errors.ConnectionClosedError(),
        nats.errors.ConnectionReconnectingError(),
        nats.errors.SlowConsumerError("s", "", 1, None),
        nats.js.errors.ServiceUnavailableError(),
        nats.errors.TimeoutError(),
    ],
)
def test_every_nats_error_is_transient_once_the_adapter_is_loaded(exc: BaseException) -> None:
    assert verdict(exc) == "transient"
