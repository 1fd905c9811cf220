"""The wire contract's names and formats (docs/CONTRACT.md), shared by the service and the producer client.

Pure: no I/O, no settings, nothing but the standard library, so `worker.client` can import it
without the service's dependencies (Postgres driver, settings, metrics).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime

# `\Z`, not `$`: `$` also matches before a trailing newline, and "acme\n" is no tenant.
TENANT_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")


@dataclass(frozen=True)
class Subjects:
    """Every subject of the contract (docs/CONTRACT.md, Subjects); tenants are validated before here."""

    prefix: str

    def schedule(self, tenant: str) -> str:
        return f"{self.prefix}.{tenant}.timer.schedule"

    def cancel(self, tenant: str) -> str:
        return f"{self.prefix}.{tenant}.timer.cancel"

    def due(self, tenant: str) -> str:
        return f"{self.prefix}.{tenant}.timer.due"

    def dlq(self, tenant: str) -> str:
        return f"{self.prefix}.{tenant}.timer.dlq"

    def get(self, tenant: str) -> str:
        return f"{self.prefix}.{tenant}.timer.get"

    @property
    def commands(self) -> list[str]:
        return [self.schedule("*"), self.cancel("*")]

    @property
    def wake(self) -> str:
        """Core-NATS hint that a timer was stored close to now (not part of the contract)."""
        return f"{self.prefix}._timer.wake"


def iso(dt: datetime) -> str:
    """RFC 3339 in UTC with milliseconds, e.g. 2026-11-23T09:00:00.123Z (docs/CONTRACT.md, DueTimeReached)."""
    return f"{_whole_second(dt.replace(microsecond=0))}.{dt.microsecond // 1000:03d}Z"


@functools.lru_cache(maxsize=4096)
def _whole_second(dt: datetime) -> str:
    # A batch of due times shares few distinct seconds: formatting each second once keeps
    # this off the firing path's profile.
    return dt.astimezone(UTC).replace(tzinfo=None).isoformat()


def firing_id(tenant_id: str, service_call_id: str, due_at: datetime) -> str:
    """One firing, one id (docs/CONTRACT.md, Duplicates): JetStream drops re-publishes of it."""
    return f"{tenant_id}:{service_call_id}:{round(due_at.timestamp() * 1000)}"
