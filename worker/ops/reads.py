"""Where is my timer, how does the fleet stand? The operator's reads, as functions the CLI
(`status`, `list`, `describe`, `cancel`) and the console share.

Each takes an open psycopg connection (a one-off read-only one from `connect`, for the CLI and
the console alike: there is no pool) and returns plain data; every statement is named in
sql/queries/ and reads on the database clock. `overview` opens its own (adapters/postgres/db.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple, cast

import psycopg
from psycopg.rows import dict_row

from worker.adapters.postgres import bulk, db
from worker.adapters.postgres.queries import QUERIES
from worker.contract import iso
from worker.core.timers import StoredTimer, due_and_planned, stored_timer, timer_view
from worker.metrics import OVERDUE_CAP
from worker.ops import fleet_stats
from worker.ops.cursors import TEXT, TIME, decode, encode
from worker.ops.diagnosis import counts_line, diagnose

# Paused: the stored state of a paused timer (sql/migrations/0011), which the contract shows as
# Scheduled with paused true; `list --state Paused` finds them.
STATES = ("Scheduled", "Paused", "Reached", "Cancelled", "Expired")
MAX_PAGE = 1000
_EARLIEST = datetime.fromisoformat("0001-01-01T00:00:00+00:00")


def fmt_time(value: datetime | None) -> str | None:
    """The one way an operator tool shows a time: the contract's (UTC, milliseconds, `Z`)."""
    return iso(value) if value is not None else None


def camel(value: Any) -> Any:
    """`value` with every dict key in the contract's camelCase and every time as fmt_time: the
    JSON the CLI prints is in the contract's one style (`status --json`, `list --json`)."""
    if isinstance(value, dict):
        return {_camel_key(str(k)): camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [camel(v) for v in value]
    if isinstance(value, datetime):
        return fmt_time(value)
    return value


def _camel_key(key: str) -> str:
    first, *rest = key.split("_")
    return first + "".join(word[:1].upper() + word[1:] for word in rest)


@contextmanager
def connect(conninfo: str) -> Iterator[psycopg.Connection[Any]]:
    """A read-only, autocommit session in UTC with the service's adapters."""
    with db.connect(conninfo, read_only=True) as conn:
        yield conn


@dataclass(frozen=True, slots=True)
class TimerFilter:
    tenant_id: str | None = None
    state: str | None = None
    due_from: datetime | None = None
    due_to: datetime | None = None
    overdue: bool = False  # Scheduled and due by now (the database's now)
    labels: dict[str, str] | None = None  # carrying every pair of these (one tenant's, in key order)

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in STATES:
            raise ValueError(f"state: one of {', '.join(STATES)}, not {self.state!r}")
        if self.tenant_id is None and self.state not in (None, "Scheduled", "Paused"):
            raise ValueError("listing every tenant shows Scheduled or Paused timers only: give a tenant")
        if self.labels and self.tenant_id is None:
            raise ValueError("a label selects one tenant's timers: give a tenant")


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None = None  # opaque: pass it back as `after` for the next page
    filter: TimerFilter = field(default_factory=TimerFilter)


def list_timers(
    conn: psycopg.Connection[Any], f: TimerFilter, after: str | None = None, limit: int = 50
) -> Page:
    """A page of timers: one tenant's in key order, or Scheduled ones in due order (every tenant,
    or one tenant's with a due window or --overdue). Keyset paging: a page costs what it reads,
    however deep it is."""
    limit = max(1, min(limit, MAX_PAGE))
    every_paused = f.tenant_id is None and f.state == "Paused"  # in key order: timers_paused
    by_due = (f.tenant_id is None or f.overdue) and not every_paused
    cur = conn.cursor(row_factory=dict_row)
    if every_paused:
        tenant, sid = decode(after, TEXT, TEXT) if after else ["", ""]
        cur.execute(
            QUERIES["inspect_paused_timers"],
            {
                "after_tenant": tenant,
                "after_id": sid,
                "due_from": f.due_from,
                "due_to": f.due_to,
                "limit": limit,
            },
        )
    elif by_due:
        due, tenant, sid = decode(after, TIME, TEXT, TEXT) if after else (None, "", "")
        due_to = f.due_to
        if f.overdue:
            (now,) = conn.execute("SELECT now()").fetchone() or (None,)
            due_to = min(due_to, now) if due_to and now else now
        start = due or f.due_from or _EARLIEST
        if f.due_from and start < f.due_from:
            start = f.due_from
        cur.execute(
            QUERIES["inspect_due_timers"],
            {
                "after_due": start,
                "after_tenant": tenant if due else "",
                "after_id": sid if due else "",
                "due_to": due_to,
                "tenant_id": f.tenant_id,
                "limit": limit,
            },
        )
    else:
        (last,) = decode(after, TEXT) if after else [""]
        terms = bulk.label_terms(f.tenant_id or "", f.labels) if f.labels else None
        params = {"tenant_id": f.tenant_id, "after": last, "state": f.state, "due_from": f.due_from,
                  "due_to": f.due_to, "terms": terms, "limit": limit}  # fmt: skip
        with conn.transaction():  # a label's plan settings (bulk.plan_listing) are this one's
            if terms:
                bulk.plan_listing(conn, params)
            cur.execute(QUERIES["inspect_tenant_timers"], params)
    rows = cur.fetchall()
    cursor = None
    if len(rows) == limit:
        last_row = rows[-1]
        key = (
            [last_row["due_at"].isoformat(), last_row["tenant_id"], last_row["service_call_id"]]
            if by_due
            else [last_row["tenant_id"], last_row["service_call_id"]]
            if every_paused
            else [last_row["service_call_id"]]
        )
        cursor = encode(key)
    return Page(rows, cursor, f)


@dataclass(frozen=True, slots=True)
class Described:
    """One timer as `describe` reads it: the stored row, typed, and what `describe` shows of it."""

    timer: StoredTimer
    view: dict[str, Any]


def describe(conn: psycopg.Connection[Any], tenant_id: str, service_call_id: str) -> dict[str, Any] | None:
    """Every field of one timer, the contract's view of it, and why it has (not) fired."""
    found = described(conn, tenant_id, service_call_id)
    return None if found is None else found.view


def described(conn: psycopg.Connection[Any], tenant_id: str, service_call_id: str) -> Described | None:
    """describe's view, with the timer it shows as a StoredTimer (its times as datetimes)."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(QUERIES["inspect_timer"], {"tenant_id": tenant_id, "service_call_id": service_call_id})
    row = cur.fetchone()
    if row is None:
        return None
    timer = stored_timer(row)
    view = timer_view(timer)
    view.update(
        leaseOwner=timer.lease_owner,
        leaseExpiresAt=fmt_time(timer.lease_expires_at),
        leaseActive=bool(row["lease_active"]),
        overdue=bool(row["overdue"]),
        updatedAt=fmt_time(timer.updated_at),
        commandTimestampMs=row["command_ts"],
        occurrenceIndex=timer.occurrence_index,
        pausedAt=fmt_time(row.get("paused_at")),
        # What its DueTimeReached events carry (trace context, producer headers): the console's
        # reschedule and fire-now send them again, so a moved timer keeps them.
        carriedHeaders=row.get("carried_headers"),
        why=diagnose(row),
    )
    return Described(timer, view)


def tenant_summary(conn: psycopg.Connection[Any], tenant_id: str) -> dict[str, Any]:
    """One tenant: its timers by state, overdue ones, the oldest of them, the next due."""
    counts = {s: n for s, n in conn.execute(QUERIES["inspect_tenant_counts"], {"tenant_id": tenant_id})}
    row = conn.execute(QUERIES["inspect_tenant_due"], {"tenant_id": tenant_id, "cap": OVERDUE_CAP}).fetchone()
    overdue, oldest, next_due = row if row else (0, None, None)
    paused_at = conn.execute(QUERIES["tenant_paused"], {"tenant_id": tenant_id}).fetchone()
    return {
        "tenant": tenant_id,
        "counts": {s: counts.get(s, 0) for s in STATES},
        "paused": counts.get("Paused", 0),
        "tenant_paused_at": fmt_time(paused_at[0]) if paused_at else None,
        "overdue": overdue or 0,
        "oldest_overdue_s": float(oldest) if oldest is not None else None,
        "next_due_at": fmt_time(next_due),
    }


def render_summary(s: dict[str, Any]) -> str:
    c = s["counts"]
    lines = [
        f"tenant     {s['tenant']}",
        counts_line(c),
        f"overdue    {s['overdue']} unclaimed"
        + (f", oldest {s['oldest_overdue_s']:.1f}s behind" if s["oldest_overdue_s"] is not None else ""),
        f"next due   {s['next_due_at'] or 'none'}",
    ]
    if s["tenant_paused_at"] or s["paused"]:
        since = f"the tenant since {s['tenant_paused_at']}" if s["tenant_paused_at"] else "timers one by one"
        lines.append(f"paused     {s['paused']} timers ({since})")
    return "\n".join(lines)


def render_page(page: Page) -> str:
    lines = [f"{'TENANT':<16} {'SERVICE CALL ID':<28} {'STATE':<10} {'DUE AT':<25} NOTE"]
    for r in page.rows:
        note = []
        if r["overdue"]:
            note.append("overdue")
        if r["lease_owner"]:
            note.append(f"claimed by {r['lease_owner']}")
        if r["last_error"]:
            note.append(f"error: {r['last_error'][:60]}")
        due, planned = due_and_planned(r["due_at"], r["nominal_due_at"])
        note += [f"planned {fmt_time(planned)}"] if planned else []
        key = f"{r['tenant_id']:<16} {r['service_call_id']:<28}"
        lines.append(f"{key} {r['state']:<10} {fmt_time(due) or '-':<25} {', '.join(note)}")
    if page.next_cursor:
        lines.append(f"more: --after {page.next_cursor}")
    return "\n".join(lines)


def row_json(r: dict[str, Any]) -> dict[str, Any]:
    """A listed row as `list --json` prints it: the contract's names and times (dueAt as `get`'s)."""
    due, planned = due_and_planned(r["due_at"], r["nominal_due_at"])
    named = {_CONTRACT_NAMES.get(k, k): v for k, v in r.items() if k != "nominal_due_at"}
    return cast(dict[str, Any], camel(named | {"due_at": due} | ({"planned_at": planned} if planned else {})))


# Columns whose contract name is not their camelCase (timer_view's names).
_CONTRACT_NAMES = {"fired_count": "occurrencesFired", "lease_owner": "leaseOwner"}


class CancelOutcome(NamedTuple):
    """What a CancelTimer did: the exit code, a word for programs (`cancel --json`), one line."""

    code: int
    outcome: str  # cancelled, already_cancelled, not_found, fired, expired, not_applied, behind_firing
    line: str


def cancel_outcome(
    conninfo: str, tenant_id: str, service_call_id: str, wait_s: float, before: dict[str, Any] | None
) -> CancelOutcome:
    """What a CancelTimer just sent did, as the database shows it within `wait_s` seconds.
    `before` is the timer as `describe` showed it before the cancel was sent: a cancel for a
    timer that did not exist stores a tombstone (so that an older ScheduleTimer still in flight
    cannot arm it), which is not a timer that was cancelled."""
    key = f"{tenant_id}/{service_call_id}"
    if before is not None and before["state"] == "Cancelled" and before["dueAt"] is not None:
        return CancelOutcome(0, "already_cancelled", f"already cancelled: {key} ({before['why']})")
    deadline = time.monotonic() + wait_s
    with connect(conninfo) as conn:
        while True:
            view = describe(conn, tenant_id, service_call_id)
            state = view["state"] if view else None
            if view is not None and state == "Cancelled":
                if view["dueAt"] is None:
                    return CancelOutcome(1, "not_found", f"no such timer: {key}; nothing to cancel")
                return CancelOutcome(0, "cancelled", f"cancelled {key}")
            if view is not None and state in ("Reached", "Expired"):  # final: the cancel is ignored
                word, done = ("fired", "has fired") if state == "Reached" else ("expired", "expired unfired")
                return CancelOutcome(1, word, f"not cancelled: {key} {done} ({view['why']})")
            if time.monotonic() > deadline:
                break
            time.sleep(0.1)  # polling a replica's intake, which has no other signal to give
    sent = f"cancel sent for {key};"
    if view is None:
        return CancelOutcome(
            1, "not_applied", f"{sent} no replica has applied it yet (see `timer-service status`)"
        )
    if view["leaseActive"]:
        return CancelOutcome(
            1, "behind_firing", f"{sent} it waits: the current occurrence is firing ({view['why']})"
        )
    return CancelOutcome(1, "not_applied", f"{sent} not applied yet, the timer is {state}: {view['why']}")


# `timer-service status`: how the fleet stands, from the database.


def overview(conninfo: str, top: int = 10) -> dict[str, Any]:
    with db.connect(conninfo) as conn:
        return {**fleet_counts(conn, top), **fleet_now(conn), "running": fleet_stats.running(conn)}


def fleet_counts(conn: psycopg.Connection[Any], top: int = 10) -> dict[str, Any]:
    """Timers by state, the tenants with the most Scheduled ones and how many tenants there are:
    counts that read the whole table (or the whole due index, or a probe per tenant), so the
    console keeps them a while (console/base.py)."""
    counts = {state: n for state, n in conn.execute(QUERIES["status_counts"])}
    tenants = [
        {"tenant": t, "scheduled": n} for t, n in conn.execute(QUERIES["status_top_tenants"], {"top": top})
    ]
    paused = [
        {"tenant": t, "paused": n, "tenant_paused_at": fmt_time(at)}
        for t, n, at in conn.execute(QUERIES["status_paused"], {"top": top})
    ]
    return {
        "counts": {s: counts.get(s, 0) for s in STATES},
        "paused": counts.get("Paused", 0),
        "paused_tenants": paused,
        "top_tenants": tenants,
        "tenant_count": int((conn.execute(QUERIES["status_tenant_count"]).fetchone() or (0,))[0]),
    }


def fleet_now(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """Overdue occurrences (capped), failed publishes backing off and the leases held: bounded
    reads of the due index, cheap enough for every look."""
    overdue_row = conn.execute(QUERIES["status_overdue"], {"cap": OVERDUE_CAP}).fetchone()
    leases = []
    backing_off = 0
    for owner, n, expiry in conn.execute(QUERIES["status_leases"]):
        if owner is None:
            # A lease without an owner is a failed publish's back-off (worker/core/publishing.py):
            # due, not fired, and retried by any replica when it runs out.
            backing_off = n
            continue
        leases.append(
            {"owner": owner, "held": n, "soonest_expiry_s": expiry.total_seconds() if expiry else None}
        )
    overdue, oldest = overdue_row if overdue_row else (0, None)
    return {
        "overdue": overdue or 0,
        "oldest_overdue_s": float(oldest) if oldest is not None else None,
        "backing_off": backing_off,
        "leases": leases,
    }


def render_overview(report: dict[str, Any], commands: str | None = None) -> str:
    """`status`; `commands` is the command backlog's line (worker/ops/fleet.py), when known."""
    c = report["counts"]
    overdue = f"{report['overdue']}{'+' if report['overdue'] >= OVERDUE_CAP else ''} unclaimed"
    if report["oldest_overdue_s"] is not None:
        overdue += f", oldest {report['oldest_overdue_s']:.1f}s behind"
    if report["backing_off"]:
        overdue += f"; {report['backing_off']} more retried after failed publishes (back-off)"
    lines = [counts_line(c), f"overdue    {overdue}"]
    if commands is not None:
        lines.append(f"commands   {commands}")
    for lease in report["leases"]:
        lines.append(f"leases     {lease['owner']}: {lease['held']} held")
    if not report["leases"]:
        lines.append("leases     none held")
    for t in report["top_tenants"]:
        lines.append(f"tenant     {t['tenant']}: {t['scheduled']} scheduled")
    for p in report.get("paused_tenants", []):
        since = f", the tenant since {p['tenant_paused_at']}" if p["tenant_paused_at"] else ""
        lines.append(f"paused     {p['tenant']}: {p['paused']} timers{since}")
    return "\n".join(lines)


def one_timer(view: dict[str, Any]) -> str:
    """`describe` and `status --id`: one field a line, each value as the JSON form writes it
    (`true`, `3`, `{"every": "PT1H"}`; never Python's `True`), a string without its quotes."""
    shown = {k: v for k, v in view.items() if v is not None}
    width = max(map(len, shown), default=0) + 2
    return "\n".join(f"{k:<{width}}{v if isinstance(v, str) else json.dumps(v)}" for k, v in shown.items())
