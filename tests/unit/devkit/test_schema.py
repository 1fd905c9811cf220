"""sql/schema.sql's generator keeps only the schema of a dump (worker/devkit/schema.py)."""

from __future__ import annotations

from worker.devkit import schema


def test_the_dump_is_normalised() -> None:
    """What pg_dump says of itself and its session is left out, so the file changes only with the schema."""
    dump = (
        "--\n-- PostgreSQL database dump\n--\n\\restrict abc\nSET statement_timeout = 0;\n"
        "SELECT pg_catalog.set_config('search_path', '', false);\n\n\n\n"
        "CREATE TABLE public.t (\n    a int\n);\n"
        "\n\n\n-- Name: t\n\\unrestrict abc\n"
    )
    assert schema.normalise(dump) == schema.HEADER + "\nCREATE TABLE public.t (\n    a int\n);\n"
