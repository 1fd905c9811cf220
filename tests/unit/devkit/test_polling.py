"""worker/devkit/polling.py: the one poll-until of the devkit, the tests and the chaos rigs."""

from __future__ import annotations

import itertools

import pytest

from worker.devkit.polling import until, until_async


def test_until_returns_what_the_check_found_zero_included() -> None:
    answers = iter([None, False, 0])  # None and False: not yet; 0 is an answer (a node's index)
    assert until(lambda: next(answers), timeout=5, interval=0) == 0


def test_until_names_what_it_waited_for_at_the_deadline() -> None:
    with pytest.raises(TimeoutError, match=r"timed out after 0.05s waiting for the standby"):
        until(lambda: False, timeout=0.05, what="the standby", interval=0.01)


def test_a_what_function_is_called_only_at_the_deadline() -> None:
    calls = itertools.count()

    def what() -> str:
        return f"the log, read {next(calls)} time(s) before"

    with pytest.raises(TimeoutError, match=r"read 0 time\(s\) before"):
        until(lambda: None, timeout=0.05, what=what, interval=0.01)


async def test_until_async_awaits_a_coroutine_check() -> None:
    seen = []

    async def check() -> bool:
        seen.append(1)
        return len(seen) == 3

    assert await until_async(check, timeout=5, interval=0) is True
    assert len(seen) == 3


async def test_until_async_takes_a_plain_check_and_times_out() -> None:
    assert await until_async(lambda: "found") == "found"
    with pytest.raises(TimeoutError, match="waiting for condition"):
        await until_async(lambda: False, timeout=0.05, interval=0.01)
