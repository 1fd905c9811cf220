"""worker/config.py: a TIMER_* variable that names no setting stops start-up, naming it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from worker.config import unknown_variables
from worker.errors import ConfigError
from worker.settings import load_settings


def test_a_timer_variable_naming_no_setting_is_named() -> None:
    env = {
        "TIMER_NATS_ULR": "nats://elsewhere:4222",  # the typo
        "timer_lease_ms": "5000",  # a setting in any case, as pydantic-settings reads it
        "TIMER_CONSOLE_TOKEN": "x" * 32,  # the console's, in an environment both share
        "TIMER_TEST_CRASH": "claimed:0.1",  # read by the replica, not a setting
        # What Kubernetes adds for a Service named timer-service and one named timer-service-console:
        "TIMER_SERVICE_SERVICE_HOST": "10.0.0.1",
        "TIMER_SERVICE_SERVICE_PORT": "8080",
        "TIMER_SERVICE_PORT": "tcp://10.0.0.1:8080",
        "TIMER_SERVICE_PORT_8080_TCP": "tcp://10.0.0.1:8080",
        "TIMER_SERVICE_PORT_8080_TCP_ADDR": "10.0.0.1",
        "TIMER_SERVICE_CONSOLE_SERVICE_PORT_HTTP": "8081",
        "TIMER_HTTPS_PORT": "8443",  # not a service link's value: a typo of TIMER_HTTP_PORT
        "OTHER_THING": "1",
    }
    assert unknown_variables(env) == ["TIMER_HTTPS_PORT", "TIMER_NATS_ULR"]


def test_settings_refuse_a_typo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIMER_LEASE_MSS", "5000")
    with pytest.raises(ConfigError, match=r"^TIMER_LEASE_MSS: not a setting \(a typo\?"):
        load_settings()


def test_run_stops_at_a_typo_with_one_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMER_")} | {"TIMER_NATS_ULR": "nats://x"}
    result = subprocess.run(
        [sys.executable, "-m", "worker", "run"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result
    assert result.stderr.strip().splitlines() == [
        "timer-service: TIMER_NATS_ULR: not a setting (a typo? README, Configuration, lists them)"
    ]
