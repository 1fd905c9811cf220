"""Crash points for tests/chaos: a replica exits at once, as SIGKILL would. Off unless TIMER_TEST_CRASH
names points, e.g. `claimed:0.01`."""

from __future__ import annotations

import os
import random

CRASH_EXIT = 86  # tells the fault-injection harness a crash point fired, not a bug


def parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, probability = item.partition(":")
        points[name] = float(probability or 1)
    return points


_POINTS = parse(os.environ.get("TIMER_TEST_CRASH", ""))


def crash_point(name: str) -> None:
    probability = _POINTS.get(name)
    if probability is not None and random.random() < probability:
        os._exit(CRASH_EXIT)
