"""A budget of event-loop time for work whose amount a tenant chooses (a rare cron schedule, skipped
occurrences counted for `times`). Work starts only while the budget is not overdrawn and is charged
afterwards. One budget per tenant, so one tenant's flood puts off only its own rows, and one for all,
which only the costliest rows (cron) wait for."""

from __future__ import annotations

import time
from collections.abc import Callable


class TimeBudget:
    """`share` of every second, at most `burst` seconds saved up. One piece of work may overdraw it; the
    debt is paid back before the next starts."""

    __slots__ = ("_at", "_burst", "_level", "_now", "_share")

    def __init__(self, share: float, burst: float, now: Callable[[], float] = time.monotonic) -> None:
        if not 0 < share <= 1 or burst <= 0:
            raise ValueError("a time budget needs a share in (0, 1] and a positive burst")
        self._share = share
        self._burst = burst
        self._now = now
        self._at = now()
        self._level = burst

    def _refill(self) -> None:
        now = self._now()
        self._level = min(self._burst, self._level + (now - self._at) * self._share)
        self._at = now

    def ready(self) -> bool:
        self._refill()
        return self._level > 0

    def charge(self, seconds: float) -> None:
        self._refill()
        self._level -= max(0.0, seconds)

    def full(self) -> bool:
        """Whether it has saved up its whole burst: as good as a new one."""
        self._refill()
        return self._level >= self._burst


class TenantBudgets:
    """A TimeBudget per tenant, and one for all that only `costly` work waits for. A tenant's budget is
    forgotten once full again."""

    __slots__ = ("_budgets", "_burst", "_now", "_share", "_total")

    def __init__(
        self,
        share: float,
        burst: float,
        total_share: float,
        total_burst: float,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        TimeBudget(share, burst, now)  # the same checks
        self._share, self._burst, self._now = share, burst, now
        self._total = TimeBudget(total_share, total_burst, now)
        self._budgets: dict[str, TimeBudget] = {}

    def ready(self, tenant: str, costly: bool) -> bool:
        budget = self._budgets.get(tenant)
        return (budget is None or budget.ready()) and (not costly or self._total.ready())

    def charge(self, tenant: str, seconds: float) -> None:
        if seconds <= 0:
            return
        budget = self._budgets.get(tenant)
        if budget is None:
            self._budgets = {t: b for t, b in self._budgets.items() if not b.full()}
            budget = self._budgets[tenant] = TimeBudget(self._share, self._burst, self._now)
        budget.charge(seconds)
        self._total.charge(seconds)

    def __len__(self) -> int:
        return len(self._budgets)
