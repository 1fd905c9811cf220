"""A budget of event-loop time for work whose amount a tenant chooses.

Computing a recurring timer's next occurrence is microseconds for most schedules, but a tenant can
choose ones that cost more: a cron schedule that matches once in decades (~2 ms a step), or one
with `times` whose skipped occurrences are counted after an outage (up to ~0.15 s; worker/core/
recurrence.py). That work runs on the event loop beside everybody's firing and intake, and a bound
per row was not enough: a thousand such rows in one claim stalled every replica in turn for tens
of seconds. The budget bounds their sum per second: work starts only while the budget is not
overdrawn, what it took beyond a free allowance is charged afterwards, and what cannot start now
waits for a later claim.

One budget per tenant (TenantBudgets): with one for the replica, a tenant that kept it overdrawn
had every recurring row met put back, another tenant's hourly timers (never charged) included,
claim after claim until its own flood had drained. And one for all of them, which only the rows
that may cost the most (cron schedules: `every` ones cost at most ~0.1 ms) wait for: forty
tenants spending their own budgets in one claim held a replica two seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TimeBudget:
    """`share` of every second (0.1: a tenth), at most `burst` seconds saved up. One piece of work
    may overdraw it: the debt is paid back, at `share`, before the next piece starts."""

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
        """Whether work may start now: the budget is not overdrawn."""
        self._refill()
        return self._level > 0

    def charge(self, seconds: float) -> None:
        """Charge work that took `seconds` (nothing for none or less)."""
        self._refill()
        self._level -= max(0.0, seconds)

    def full(self) -> bool:
        """Whether it has saved up its whole burst: as good as a new one."""
        self._refill()
        return self._level >= self._burst


class TenantBudgets:
    """A TimeBudget of `share` and `burst` per tenant, and one of `total_share` and `total_burst`
    for all: what one tenant's work overdraws puts off that tenant's work only; what all of them
    overdraw puts off the rows that may be costly (`costly`). A tenant is given a budget when first
    charged and forgets it once it is full again, so only tenants charged within the last
    `burst / share` seconds are held."""

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
        """Whether `tenant`'s work may start now: its budget is not overdrawn, nor, for work that
        may be costly, the total."""
        budget = self._budgets.get(tenant)
        return (budget is None or budget.ready()) and (not costly or self._total.ready())

    def charge(self, tenant: str, seconds: float) -> None:
        """Charge `tenant` for work that took `seconds` (nothing for none or less)."""
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
