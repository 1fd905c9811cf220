"""The named SQL (sql/queries.sql) where two statements must agree."""

from __future__ import annotations

import re

from worker.adapters.postgres.queries import QUERIES


def _set_list(statement: str) -> dict[str, str]:
    """The SET list of a statement's `UPDATE timers t SET`, column to expression, comments and
    layout removed."""
    text = re.sub(r"--[^\n]*", "", statement)
    body = text.split("UPDATE timers t SET", 1)[1].split("\nFROM ", 1)[0]
    assignments: dict[str, str] = {}
    column = ""
    for line in body.splitlines():
        if match := re.match(r"\s{4}(\w+) = (.*)", line):
            column = match[1]
            assignments[column] = match[2]
        elif line.strip():
            assignments[column] += " " + line.strip()
    return {c: " ".join(e.split()).rstrip(",") for c, e in assignments.items()}


def test_a_firing_recorded_again_sets_what_its_mark_would_have() -> None:
    """mark_fired_again records, after its claim was rolled back, what mark_fired would have:
    column for column but what only the claim held: the recurrence reference (it comes back as
    recurrence_ref) and the claim's attempts, which a finished timer keeps. The two SET lists are
    written twice; this keeps them from drifting apart."""
    mark, again = _set_list(QUERIES["mark_fired"]), _set_list(QUERIES["mark_fired_again"])
    assert mark.keys() == again.keys()
    assert mark["claimed_at"] == "CASE WHEN f.next_due_at <= f.db_now THEN t.claimed_at END"
    assert again["claimed_at"] == "CASE WHEN f.next_due_at <= f.db_now THEN f.recurrence_ref END"
    assert mark["attempts"] == "CASE WHEN f.next_due_at IS NULL THEN t.attempts ELSE 0 END"
    assert again["attempts"] == "CASE WHEN f.next_due_at IS NULL THEN f.attempts ELSE 0 END"
    claim_only = ("claimed_at", "attempts")
    assert {c: e for c, e in mark.items() if c not in claim_only} == {
        c: e for c, e in again.items() if c not in claim_only
    }
