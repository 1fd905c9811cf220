"""Why a timer stands where it stands: one line from its row, the `why` of `describe` (reads.py)
and of the console's timer page. A function of the row alone (it carries the database's now, so
no replica's clock judges lateness). And `status`'s line of timers by state (counts_line)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from worker.contract import iso


def diagnose(row: dict[str, Any]) -> str:
    """One line: where the timer stands and, when it has not fired, the likeliest reason."""
    state, now = row["state"], row["db_now"]
    if state == "Reached":
        return f"fired: the last occurrence was recorded at {_at(row['reached_at'])}"
    if state == "Expired":
        return (
            f"expired: not published within its expireAfter {row.get('expire_after')}; never fired"
            " (its DLQ entry, reason expired, says how late)"
        )
    if state == "Cancelled":
        if row["due_at"] is None:
            return "cancelled before any ScheduleTimer arrived (a tombstone keeping the order)"
        return f"cancelled at {_at(row['updated_at'])}; it will not fire"
    due: datetime | None = row["due_at"]
    if state == "Paused":
        by = f"by itself since {_at(row['paused_at'])}" if row.get("paused_at") else "with its tenant"
        return f"paused {by}: it does not fire until resumed (`timer-service resume`); due {_at(due)}"
    if due is None:
        return "its dueAt cannot be read (outside 0001..9999): it fails alone, see lastError"
    expires: datetime | None = row["lease_expires_at"]
    if expires is not None and expires > now and row["lease_owner"]:
        return (
            f"claimed by {row['lease_owner']} (attempt {row['attempts']}), lease until "
            f"{_at(expires)}: firing now"
        )
    if expires is not None and expires > now:
        return (
            f"publishing failed ({row['last_error'] or 'no error recorded'}); retried by any replica "
            f"after {_at(expires)} (attempt {row['attempts']})"
        )
    if due > now:
        return f"waiting: due in {_span(due - now)}"
    if row["attempts"]:
        return (
            f"overdue by {_span(now - due)} after {row['attempts']} attempt(s); last error: "
            f"{row['last_error'] or 'none (a replica died holding it)'}"
        )
    return f"overdue by {_span(now - due)} and unclaimed: are replicas running and ready? (`status`)"


def _at(value: datetime | None) -> str:
    return iso(value) if value is not None else "?"


def _span(d: timedelta) -> str:
    s = d.total_seconds()
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def counts_line(c: dict[str, int]) -> str:
    """The timers by state, as `status` shows them: Expired only when there are some (expiry is rare)."""
    expired = f" expired={c['Expired']}" if c.get("Expired") else ""
    return f"timers     scheduled={c['Scheduled']} reached={c['Reached']} cancelled={c['Cancelled']}{expired}"
