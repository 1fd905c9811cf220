"""worker/adapters/jetstream/pull.py against what a consumer may refuse, and fetches shorter than the
request's margin (an adversarial review's findings, each failing before its fix)."""

from __future__ import annotations

import asyncio

import pytest

from tests.unit.adapters.jetstream.test_pull import answered, started
from worker.adapters.jetstream import pull as pull_module


async def test_a_batch_the_consumer_refuses_as_too_large_is_not_asked_for_again_forever() -> None:
    # The consumer (or the server's jetstream limits) caps a pull's batch: every fetch of
    # TIMER_INTAKE_BATCH_SIZE is refused, intake logs "fetch failed" each second and takes no
    # command again, ever. The limit is in the refusal: the next request must keep to it.
    conn, pull = await started()
    fetch = asyncio.create_task(pull.fetch(1000, 5.0))
    await answered(conn, fetch, 1)
    await conn.status("409", "Exceeded MaxRequestBatch of 100")
    with pytest.raises(pull_module.PullFailed, match="MaxRequestBatch"):
        await fetch
    fetch = asyncio.create_task(pull.fetch(1000, 5.0))
    await answered(conn, fetch, 2)
    batch = conn.requests[1][1]["batch"]
    fetch.cancel()
    assert batch <= 100, f"asked for {batch} again after the consumer refused more than 100"


@pytest.mark.parametrize("timeout", [0.005, pull_module.EXPIRES_MARGIN_S])
async def test_a_fetch_at_or_below_the_expires_margin_still_asks(timeout: float) -> None:
    # A fetch of at most EXPIRES_MARGIN_S has no expiry left for its request and raises
    # TimeoutError at once, never asking: messages stored in the stream are never fetched with
    # it (measured on a real server: 0.005 and 0.01 time out in 0.0 s with messages stored).
    conn, pull = await started()
    with pytest.raises(TimeoutError):
        await pull.fetch(10, timeout)
    assert len(conn.requests) == 1, "the fetch gave up without asking the server"
