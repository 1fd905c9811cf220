"""The named SQL of sql/queries/: one namespace over its files, fragments written once, one line
under each name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from worker.adapters.postgres.queries import QUERIES, QueryFileError, parse

QUERY_FILES = sorted((Path(__file__).resolve().parents[4] / "sql" / "queries").glob("*.sql"))


def test_fragments_are_spliced_where_a_statement_names_them() -> None:
    text = (
        "-- fragment: live\n-- Not finished.\nstate <> 'Reached'\n\n"
        "-- name: a\n-- One.\nSELECT 1 FROM timers WHERE {{live}};\n\n"
        "-- name: b\n-- Two.\nDELETE FROM timers WHERE NOT ({{live}});\n"
    )
    assert parse([text]) == {
        "a": "-- One.\nSELECT 1 FROM timers WHERE state <> 'Reached';",
        "b": "-- Two.\nDELETE FROM timers WHERE NOT (state <> 'Reached');",
    }


@pytest.mark.parametrize(
    ("texts", "error"),
    [
        (["-- name: a\nSELECT 1;\n", "-- name: a\nSELECT 2;\n"], "a is defined twice"),
        (["-- fragment: a\n1\n-- name: a\nSELECT {{a}};\n"], "a is defined twice"),
        (["-- name: a\nSELECT {{one}};\n"], "no fragment one"),
        (["-- fragment: one\n1\n-- name: a\nSELECT 1;\n"], "fragment one is used nowhere"),
        (["-- fragment: one\n1 -- one\n-- name: a\nSELECT {{one}}, 2;\n"], "fragment one holds a comment"),
    ],
)
def test_a_broken_query_file_is_refused_naming_what(texts: list[str], error: str) -> None:
    with pytest.raises(QueryFileError, match=error):
        parse(texts)


def test_every_statement_has_one_line_saying_what_it_does() -> None:
    """The why goes to docs/SQL.md: under a name, one comment line, then the SQL."""
    assert QUERY_FILES
    for path in QUERY_FILES:
        for name, first, second in re.findall(r"^-- name: (\w+)\n(.*)\n(.*)", path.read_text(), re.M):
            assert first.startswith("-- ") and not second.startswith("--"), f"{path.name}: {name}"


def test_every_statement_is_documented() -> None:
    documented = set(
        re.findall(r"^### (\w+)$", (QUERY_FILES[0].parents[2] / "docs" / "SQL.md").read_text(), re.M)
    )
    assert set(QUERIES) - documented == set()


def test_a_firing_recorded_again_sets_what_its_record_would_have() -> None:
    """record_fired_again writes, after its claim was rolled back, what record_fired would have:
    one SET list, the claim's recurrence reference and attempts where record_fired reads the row's."""
    record, again = QUERIES["record_fired"], QUERIES["record_fired_again"]
    set_list = re.compile(r"UPDATE timers t SET\n(.*?)\nFROM ", re.S)
    assert set_list.search(record)[1] == set_list.search(again)[1]  # type: ignore[index]
    assert "NULL::timestamptz AS recurrence_ref, NULL::int AS attempts" in record
    assert "%(recurrence_ref)b" in again and "%(attempts)b" in again


def test_docs_states_names_every_statement_that_writes_a_timer_row_and_no_other() -> None:
    """docs/STATES.md draws the row's states with the statement that moves each: every statement
    that writes `timers` is in it, and each its transitions name exists (or is a fragment)."""
    states = (QUERY_FILES[0].parents[2] / "docs" / "STATES.md").read_text()
    writers = {
        n for n, sql in QUERIES.items() if re.search(r"\b(?:UPDATE|INSERT INTO|DELETE FROM) timers\b", sql)
    }
    assert {"claim_due", "record_fired", "retry_later", "upsert_schedules", "delete_finished"} <= writers
    assert writers - set(re.findall(r"`(\w+)`", states)) == set()
    fragments = {f for p in QUERY_FILES for f in re.findall(r"^-- fragment: (\w+)$", p.read_text(), re.M)}
    transitions = states.split("## The transitions", 1)[1]
    moved_by = {
        name
        for row in re.findall(r"^\|(.*)\|$", transitions, re.M)[2:]  # past the header and its rule
        for name in re.findall(r"`(\w+)`", row.split("|")[2])
    }
    assert moved_by and moved_by - set(QUERIES) - fragments == set()
    diagram = states.split("```mermaid", 1)[1].split("```", 1)[0]
    drawn = {
        n for labels in re.findall(r"--> \w+: (.*)", diagram) for n in re.findall(r"\b[a-z]+_\w+\b", labels)
    }
    assert drawn and drawn - set(QUERIES) == set(), "a diagram's arrow names a statement that is not there"
