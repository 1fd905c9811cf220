"""How the loops wait (worker/core/waiting.py): retry_transient, the one retry of a write that a
transient failure interrupted (the firing loop's records, intake's batches)."""

from __future__ import annotations

import pytest

from worker.core.waiting import retry_transient
from worker.errors import TransientError


class Flaky:
    """Fails with each of `errors` in turn, then answers 7."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0

    async def __call__(self) -> int:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return 7


async def test_a_transient_failure_is_tried_again() -> None:
    call = Flaky(TransientError("blip"), TransientError("blip"))
    assert await retry_transient(call, within_s=5, first_s=0.001, max_s=0.001) == 7
    assert call.calls == 3


async def test_any_other_error_is_raised_at_once() -> None:
    call = Flaky(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        await retry_transient(call, within_s=5, first_s=0.001, max_s=0.001)
    assert call.calls == 1


async def test_past_its_time_the_transient_error_itself_is_raised() -> None:
    call = Flaky(*(TransientError(f"down {i}") for i in range(1000)))
    with pytest.raises(TransientError, match="down"):
        await retry_transient(call, within_s=0.05, first_s=0.01, max_s=0.01)
    assert 1 < call.calls < 1000
