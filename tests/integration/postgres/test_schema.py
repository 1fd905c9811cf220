"""sql/schema.sql is what the migrations build (worker/devkit/schema.py): a migration without
`make schema` fails here, naming the first difference."""

from __future__ import annotations

import difflib

from worker.devkit import schema


def test_schema_sql_is_what_the_migrations_build(db_url: str) -> None:
    built = schema.dump(db_url)
    written = schema.SCHEMA.read_text(encoding="utf-8")
    diff = "\n".join(
        difflib.unified_diff(written.splitlines(), built.splitlines(), "sql/schema.sql", "migrated", n=1)
    )
    assert built == written, f"sql/schema.sql is stale: run `make schema`\n{diff[:2000]}"
