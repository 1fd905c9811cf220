"""How a replica's start-up steps run side by side (service.side_by_side): Postgres and NATS come
up at once, and a failure of either still ends start-up, or is retried, as when they ran in turn."""

from __future__ import annotations

import asyncio

import pytest

from worker.errors import ConfigError, TransientError
from worker.service import side_by_side


async def test_the_results_come_in_the_order_of_the_steps() -> None:
    later = asyncio.Event()

    async def first() -> str:
        await later.wait()  # ends after the second
        return "postgres"

    async def second() -> str:
        later.set()
        return "nats"

    assert await asyncio.wait_for(side_by_side(first(), second()), timeout=10) == ["postgres", "nats"]


async def test_a_config_error_stops_start_up_and_cancels_what_runs_beside_it() -> None:
    cancelled = asyncio.Event()

    async def hangs() -> None:  # a NATS connect that never answers
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def refuses() -> None:
        raise ConfigError("database x is encoded SQL_ASCII; timer-service needs UTF8")

    with pytest.raises(ConfigError, match="SQL_ASCII"):
        await asyncio.wait_for(side_by_side(hangs(), refuses()), timeout=10)
    assert cancelled.is_set()


async def test_a_quick_transient_failure_does_not_hide_a_config_error_beside_it() -> None:
    """A NATS refusing at once must not cancel the database check that would have stopped
    start-up: retried, it would refuse at once again, and the replica would retry forever."""
    nats_failed = asyncio.Event()

    async def database() -> None:
        await nats_failed.wait()  # the check answers only after NATS has failed
        raise ConfigError("database x is encoded LATIN1; timer-service needs UTF8")

    async def nats() -> None:
        nats_failed.set()
        raise TransientError("nats: connection refused")

    with pytest.raises(ConfigError, match="LATIN1"):
        await asyncio.wait_for(side_by_side(database(), nats()), timeout=10)


async def test_of_transient_failures_the_first_steps_is_raised_as_itself_after_the_others_end() -> None:
    ended: list[str] = []
    nats_failed = asyncio.Event()
    cause = OSError("the driver's error")

    async def postgres() -> None:
        await nats_failed.wait()  # fails after NATS, and is still the one said (it comes first)
        ended.append("postgres")
        raise TransientError("postgres: connection refused") from cause

    async def nats() -> None:
        ended.append("nats")
        nats_failed.set()
        raise OSError("nats: connection refused")

    async def streams() -> None:
        await nats_failed.wait()
        ended.append("streams")

    with pytest.raises(TransientError, match="postgres") as raised:
        await asyncio.wait_for(side_by_side(postgres(), nats(), streams()), timeout=10)
    assert sorted(ended) == ["nats", "postgres", "streams"]
    assert raised.value.__cause__ is cause, "not re-wrapped: readiness and the logs read the cause"
