"""Migrations that a rolling upgrade can live with (docs/UPGRADING.md).

The old replicas keep running while the migrate Job applies a new migration, so a migration
must neither stop them for long nor break them: every file in sql/migrations/ is parsed with
PostgreSQL's own parser (pglast) and refused when, on a table an earlier migration made, it
  * builds an index without CONCURRENTLY (a SHARE lock: no write until the build ends);
  * rewrites the table (ADD COLUMN with a volatile default, ALTER COLUMN ... TYPE) or scans it
    under its lock (SET NOT NULL, ADD COLUMN ... NOT NULL, a CHECK or foreign key without
    NOT VALID);
  * sets lock_timeout: the runner (worker/adapters/postgres/migrations.py) waits a short one per attempt and
    retries, so an ALTER behind a long transaction never queues claims and commands for longer;
    a file's own would replace it (the 5 s the old rule asked for held the fleet up for 5 s).
A CONCURRENTLY statement cannot run in a transaction: its file starts `-- migration:
no-transaction` (worker/adapters/postgres/migrations.py runs it statement by statement) and drops a half-built
index of the same name first, so a run interrupted half-way can be run again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pglast
import psycopg
import pytest
from pglast import ast, enums
from pglast.visitors import Visitor

from worker.adapters.postgres import migrations

MIGRATIONS = Path(__file__).parents[3] / "sql" / "migrations"

# Default expressions PostgreSQL stores once instead of writing into every row (not volatile).
_STABLE_DEFAULTS = {"now", "statement_timestamp", "transaction_timestamp"}


@dataclass
class Checked:
    problems: set[str]
    created: set[str]  # tables this file creates


def lint(text: str, existing: set[str]) -> Checked:
    """The rules above, for one migration's text, given the tables earlier migrations made."""
    problems: set[str] = set()
    created: set[str] = set()
    no_transaction = text.startswith(migrations.NO_TRANSACTION)
    dropped_first: set[str] = set()  # indexes dropped CONCURRENTLY IF EXISTS before being built
    statements = [raw.stmt for raw in pglast.parse_sql(text)]
    if no_transaction and len(migrations.statements(text)) != len(statements):
        problems.add("no-transaction: each statement must end a line with ;")
    for stmt in statements:
        table = _table(stmt)
        old = table is not None and table in existing and table not in created
        match stmt:
            case ast.CreateStmt():
                created.add(stmt.relation.relname)
            case ast.VariableSetStmt(name="lock_timeout"):
                problems.add(
                    "SET lock_timeout: the runner sets a short one per attempt; this would replace it"
                )
            case ast.IndexStmt() if stmt.concurrent:
                if not no_transaction:
                    problems.add("CONCURRENTLY needs `-- migration: no-transaction`")
                if stmt.idxname not in dropped_first:
                    problems.add(
                        f"CREATE INDEX CONCURRENTLY {stmt.idxname}: drop it CONCURRENTLY IF EXISTS first"
                    )
            case ast.IndexStmt() if old:
                problems.add(f"CREATE INDEX without CONCURRENTLY on {table}")
            case ast.DropStmt(removeType=enums.ObjectType.OBJECT_INDEX, concurrent=True):
                if not no_transaction:
                    problems.add("CONCURRENTLY needs `-- migration: no-transaction`")
                if stmt.missing_ok:
                    dropped_first |= {names[-1].sval for names in stmt.objects}
            case ast.AlterTableStmt() if old:
                problems |= _alter_problems(stmt, table or "")
    return Checked(problems, created)


def _table(stmt: ast.Node) -> str | None:
    relation = getattr(stmt, "relation", None)
    return relation.relname if isinstance(relation, ast.RangeVar) else None


def _alter_problems(stmt: ast.AlterTableStmt, table: str) -> set[str]:
    problems = set()
    for cmd in stmt.cmds:
        if cmd.subtype == enums.AlterTableType.AT_AlterColumnType:
            problems.add(f"ALTER COLUMN {cmd.name} TYPE rewrites {table}")
        elif cmd.subtype == enums.AlterTableType.AT_SetNotNull:
            problems.add(f"SET NOT NULL scans {table} under its lock: add a CHECK ... NOT VALID first")
        elif cmd.subtype == enums.AlterTableType.AT_AddColumn:
            constraints = cmd.def_.constraints or ()
            default = next(
                (c.raw_expr for c in constraints if c.contype == enums.ConstrType.CONSTR_DEFAULT), None
            )
            if default is not None and _volatile(default):
                problems.add(f"ADD COLUMN {cmd.def_.colname} with a volatile default rewrites {table}")
            not_null = any(c.contype == enums.ConstrType.CONSTR_NOTNULL for c in constraints)
            if not_null and default is None:
                problems.add(f"ADD COLUMN {cmd.def_.colname} NOT NULL without a default fails on rows")
        elif (
            cmd.subtype == enums.AlterTableType.AT_AddConstraint
            and not cmd.def_.skip_validation
            and cmd.def_.contype in (enums.ConstrType.CONSTR_CHECK, enums.ConstrType.CONSTR_FOREIGN)
        ):
            problems.add(f"ADD CONSTRAINT {cmd.def_.conname} scans {table}: add it NOT VALID")
    return problems


def _volatile(expr: ast.Node) -> bool:
    """True when the expression calls a function not known to be stable (its value per row)."""
    found = False

    class Calls(Visitor):  # type: ignore[misc]
        def visit_FuncCall(self, _ancestors: object, node: ast.FuncCall) -> None:
            nonlocal found
            found |= node.funcname[-1].sval not in _STABLE_DEFAULTS

    Calls()(expr)
    return found


def test_every_shipped_migration_keeps_a_rolling_upgrade_safe() -> None:
    existing: set[str] = set()
    refused = {}
    for path in sorted(MIGRATIONS.glob("*.sql")):
        checked = lint(path.read_text(encoding="utf-8"), existing)
        if checked.problems:
            refused[path.name] = sorted(checked.problems)
        existing |= checked.created
    assert not refused, refused


NEXT_RELEASE = Path(__file__).parents[2] / "fixtures" / "next_release"  # stand-ins for the next migrations


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("CREATE INDEX i ON timers (due_at);", "CREATE INDEX without CONCURRENTLY on timers"),
        (
            "DROP INDEX CONCURRENTLY IF EXISTS i; CREATE INDEX CONCURRENTLY i ON timers (a);",
            "CONCURRENTLY needs",
        ),
        ("-- migration: no-transaction\nCREATE INDEX CONCURRENTLY i ON timers (a);", "drop it CONCURRENTLY"),
        ("ALTER TABLE timers ALTER COLUMN attempts TYPE bigint;", "TYPE rewrites"),
        (
            "ALTER TABLE timers ADD COLUMN n uuid DEFAULT gen_random_uuid();",
            "volatile",
        ),
        ("ALTER TABLE timers ADD COLUMN n int NOT NULL;", "NOT NULL without"),
        ("ALTER TABLE timers ALTER COLUMN due_at SET NOT NULL;", "SET NOT NULL"),
        ("ALTER TABLE timers ADD CONSTRAINT c CHECK (attempts >= 0);", "NOT VALID"),
        ("SET lock_timeout = '5s'; ALTER TABLE timers ADD COLUMN n text;", "SET lock_timeout"),
        ("SET LOCAL lock_timeout = '5s'; ALTER TABLE timers ADD COLUMN n text;", "SET lock_timeout"),
        (
            "-- migration: no-transaction\nSET lock_timeout = '5s';\nDROP INDEX CONCURRENTLY IF EXISTS i;",
            "SET lock_timeout",
        ),
    ],
)
def test_the_rules_refuse_what_would_stall_or_break_the_old_replicas(text: str, problem: str) -> None:
    problems = lint(text, {"timers"}).problems
    assert any(problem in p for p in problems), problems


def test_the_rules_let_through_what_a_rolling_upgrade_can_live_with() -> None:
    ok = [
        *(path.read_text() for path in sorted(NEXT_RELEASE.glob("*.sql"))),
        "ALTER TABLE timers ADD COLUMN n text;",
        "ALTER TABLE timers ADD COLUMN n text DEFAULT 'x';",
        "ALTER TABLE timers ADD COLUMN at timestamptz NOT NULL DEFAULT now();",
        "ALTER TABLE timers ADD CONSTRAINT c CHECK (attempts >= 0) NOT VALID;",
        "ALTER TABLE timers VALIDATE CONSTRAINT c; ALTER TABLE timers SET (fillfactor = 50);",
        "CREATE TABLE t (a int); CREATE INDEX ti ON t (a);",
    ]
    assert [lint(text, {"timers"}).problems for text in ok] == [set()] * len(ok)


def test_a_no_transaction_migration_builds_its_index_concurrently(db_url: str, tmp_path: Path) -> None:
    """The runner applies a CONCURRENTLY migration outside a transaction, records it, and
    leaves the session settings it made behind. (In one transaction it failed: CREATE INDEX
    CONCURRENTLY cannot run inside a transaction block.)"""
    for path in [*MIGRATIONS.glob("*.sql"), *NEXT_RELEASE.glob("*.sql")]:
        (tmp_path / path.name).write_text(path.read_text(encoding="utf-8"))
    assert migrations.migrate(db_url, tmp_path) == [98, 99]
    assert migrations.migrate(db_url, tmp_path) == []
    with psycopg.connect(db_url, autocommit=True) as conn:
        valid = conn.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = 'timers_tenant_due'::regclass"
        ).fetchone()
        names = conn.execute("SELECT name FROM timer_schema_version WHERE version = 99").fetchone()
    assert valid == (True,)
    assert names == ("tenant_due",)


def _timers_vacuum_cost_delay(conn: psycopg.Connection[tuple[object, ...]]) -> object:
    return conn.execute(
        "SELECT o.option_value FROM pg_class c, pg_options_to_table(c.reloptions) o"
        " WHERE c.oid = 'timers'::regclass AND o.option_name = 'autovacuum_vacuum_cost_delay'"
    ).fetchone()


@pytest.mark.parametrize(("before", "after"), [("1", "5"), ("10", "10"), ("0", "0")])
def test_the_gentler_autovacuum_replaces_only_the_migrations_own_delay(
    db_url: str, before: str, after: str
) -> None:
    """0018 moves timers' autovacuum cost delay from 0001's 1 ms to 5; a delay an operator set
    is theirs and stays. (Run again by forgetting it was applied: the database is migrated.)"""
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert _timers_vacuum_cost_delay(conn) == ("5",)  # what a fresh install gets
        conn.execute(f"ALTER TABLE timers SET (autovacuum_vacuum_cost_delay = {before})")
        conn.execute("DELETE FROM timer_schema_version WHERE version = 18")
        assert migrations.migrate(db_url) == [18]
        assert _timers_vacuum_cost_delay(conn) == (after,)
