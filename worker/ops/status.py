"""`timer-service status`: how the fleet stands, from the database."""

from __future__ import annotations

from typing import Any

from worker.adapters import db
from worker.adapters.queries import OVERDUE_CAP, QUERIES


def overview(conninfo: str, top: int = 10) -> dict[str, Any]:
    with db.connect(conninfo) as conn:
        counts = {state: n for state, n in conn.execute(QUERIES["status_counts"])}
        overdue_row = conn.execute(QUERIES["status_overdue"], {"cap": OVERDUE_CAP}).fetchone()
        leases = [
            {"owner": owner, "held": n, "soonest_expiry_s": expiry.total_seconds() if expiry else None}
            for owner, n, expiry in conn.execute(QUERIES["status_leases"])
        ]
        tenants = [
            {"tenant": t, "scheduled": n}
            for t, n in conn.execute(QUERIES["status_top_tenants"], {"top": top})
        ]
    overdue, oldest = overdue_row if overdue_row else (0, None)
    return {
        "counts": {s: counts.get(s, 0) for s in ("Scheduled", "Reached", "Cancelled")},
        "overdue": overdue or 0,
        "oldest_overdue_s": float(oldest) if oldest is not None else None,
        "leases": leases,
        "top_tenants": tenants,
    }


def render(report: dict[str, Any]) -> str:
    c = report["counts"]
    lines = [
        f"timers     scheduled={c['Scheduled']} reached={c['Reached']} cancelled={c['Cancelled']}",
        f"overdue    {report['overdue']}{'+' if report['overdue'] >= OVERDUE_CAP else ''} unclaimed"
        + (
            f", oldest {report['oldest_overdue_s']:.1f}s behind"
            if report["oldest_overdue_s"] is not None
            else ""
        ),
    ]
    for lease in report["leases"]:
        lines.append(f"leases     {lease['owner']}: {lease['held']} held")
    if not report["leases"]:
        lines.append("leases     none held")
    for t in report["top_tenants"]:
        lines.append(f"tenant     {t['tenant']}: {t['scheduled']} scheduled")
    return "\n".join(lines)


def one_timer(view: dict[str, Any]) -> str:
    return "\n".join(f"{k:<17}{v}" for k, v in view.items() if v is not None)
