"""claim_due's rows, read by the names of its columns (Store.claim)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from worker.core.domain import Claimed, ClaimResult, Unreadable
from worker.errors import DatabaseError


@dataclass(frozen=True, slots=True)
class _ClaimReader:
    """Where claim_due's columns are, by name. Rows are fetched as plain tuples (a row class built
    each row by keyword was 8 % of a replica's CPU in a drain), and read by the positions the
    cursor's description gives, found once per shape: a column added to the statement cannot
    shift a field silently, and one missing fails the claim, naming it."""

    claimed: Callable[[Sequence[Any]], tuple[Any, ...]]  # Claimed's fields, in its order
    unreadable: Callable[[Sequence[Any]], tuple[Any, ...]]  # Unreadable's
    tenant_id: int
    due_at: int
    next_due_at: int
    db_now: int
    row_id: int
    recorded: int  # the claim wrote the occurrence as fired (claim_due)


@functools.lru_cache(maxsize=4)
def _reader_for(names: tuple[str, ...]) -> _ClaimReader:
    where = {n: i for i, n in enumerate(names)}
    missing = [f for f in (*Claimed._fields, "next_due_at", "db_now", "recorded") if f not in where]
    if missing:
        raise DatabaseError(f"claim_due returns no column {', '.join(missing)} (sql/queries.sql)")
    return _ClaimReader(
        claimed=operator.itemgetter(*(where[f] for f in Claimed._fields)),
        unreadable=operator.itemgetter(*(where[f] for f in Unreadable._fields)),
        tenant_id=where["tenant_id"],
        due_at=where["due_at"],
        next_due_at=where["next_due_at"],
        db_now=where["db_now"],
        row_id=where["row_id"],
        recorded=where["recorded"],
    )


def claim_result(
    names: Sequence[str], rows: Sequence[Sequence[Any]], received: float | None = None
) -> ClaimResult:
    """claim_due's rows, read by the names of its columns (`received`: when they arrived, on
    time.monotonic)."""
    read = _reader_for(tuple(names))
    # The one row of a claim that took nothing has NULL in every timer column.
    key, due_at = read.tenant_id, read.due_at
    taken = [r for r in rows if r[key] is not None]
    db_now = max(r[read.db_now] for r in rows)  # the latest reading of the clock
    next_due_at = rows[0][read.next_due_at]  # the same on every row
    return ClaimResult(
        claimed=[Claimed._make(read.claimed(r)) for r in taken if r[due_at] is not None],
        unreadable=[Unreadable._make(read.unreadable(r)) for r in taken if r[due_at] is None],
        next_due_in_ms=None if next_due_at is None else (next_due_at - db_now).total_seconds() * 1000,
        db_now=db_now,
        received=received,
    )


def recorded_ids(names: Sequence[str], rows: Sequence[Sequence[Any]]) -> frozenset[str]:
    """The row ids of the occurrences claim_due recorded as fired (its `recorded` column)."""
    read = _reader_for(tuple(names))
    flag, row_id = read.recorded, read.row_id
    return frozenset(r[row_id] for r in rows if r[flag])
