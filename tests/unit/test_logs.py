"""logs.Throttled: a warning that can come once per message, written at most once an interval."""

from __future__ import annotations

import logging

import pytest

from worker.logs import Throttled


def test_a_throttled_warning_is_written_once_an_interval_with_what_it_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="test.throttled")
    now = 100.0
    line = Throttled(logging.getLogger("test.throttled"), every_s=10.0, now=lambda: now)
    for _ in range(1000):
        line.warning("get failed", {"action": "get_failed"})
    now += 9.9
    line.warning("get failed", {"action": "get_failed"})
    now += 0.1
    line.warning("get failed", {"action": "get_failed", "error": "later"})
    line.warning("get failed", {"action": "get_failed"})
    now += 10.0
    line.warning("get failed", {"action": "get_failed"})
    written = [(r.__dict__.get("suppressed"), r.__dict__.get("error")) for r in caplog.records]
    assert written == [(None, None), (1000, "later"), (1, None)]
