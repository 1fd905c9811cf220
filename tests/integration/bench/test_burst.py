"""tools/bench/burst.py (`burst`, `burst-window`) end to end at a tiny size, through `timer-service bench`."""

from __future__ import annotations

import os

from tests.integration.bench import run_json


def test_a_burst_with_a_window_reaches_the_consumer_as_a_steady_rate(
    pg_server_url: str, nats_url: str
) -> None:
    # 1,000 timers due at one instant (100,000 x 0.01), without and with a window (ten minutes,
    # scaled to its floor of 10 s): the consumer's busiest second holds most of the first, a
    # tenth or so of the second; neither publishes any event before its planned instant.
    env = {**os.environ, "TIMER_DATABASE_URL": pg_server_url, "TIMER_NATS_URL": nats_url}
    argv = ["burst", "burst-window", "--scale", "0.01", "--runs", "1", "--json"]
    report, _ = run_json(["-m", "worker", "bench", *argv], env)
    spike, spread = (report["results"][name]["median"] for name in ("burst", "burst-window"))
    assert spike["timers"] == spread["timers"] == 1000
    assert spike["early"] == spread["early"] == 0 and spike["lost"] == spread["lost"] == 0
    assert spike["window_s"] == 0 and spread["window_s"] == 10
    assert spread["receive_span_s"] >= 9 and spread["peak_per_s"] * 2 < spike["peak_per_s"]
