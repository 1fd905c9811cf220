"""sql/schema.sql, generated (`make schema`): the migrations' schema in one file for a reader,
from a throwaway Postgres's normalised `pg_dump --schema-only`."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from worker.devkit.embedded import EmbeddedPostgres, postgres_bin

SCHEMA = Path(__file__).resolve().parents[2] / "sql" / "schema.sql"
HEADER = (
    "-- The schema sql/migrations builds, generated (`make schema`): read it, never edit it.\n"
    "-- timers.claimed_at holds the recurrence reference, not when the row was claimed (read as\n"
    "-- recurrence_ref; docs/SQL.md, record_fired): its name is older than its use.\n"
)
# Not the schema: session settings, and the \restrict key drawn anew each run.
_NOISE = re.compile(r"^(SET |SELECT pg_catalog\.set_config|\\restrict |\\unrestrict )")


def normalise(dump: str) -> str:
    """A pg_dump's schema without comments, session settings and runs of blank lines."""
    kept = [line for line in dump.splitlines() if not line.startswith("--") and not _NOISE.match(line)]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()
    return HEADER + "\n" + text + "\n"


def dump(url: str) -> str:
    """The normalised schema of the database at `url`, by the embedded wheel's pg_dump."""
    argv = [str(postgres_bin() / "pg_dump"), "--schema-only", "--no-owner", "--no-privileges", url]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pg_dump failed: {done.stderr.strip()}")
    return normalise(done.stdout)


def generate() -> str:
    """Migrate a throwaway embedded Postgres and dump its schema."""
    from worker.adapters.postgres.migrations import migrate

    with tempfile.TemporaryDirectory(prefix="timer-schema-") as base:
        server = EmbeddedPostgres(Path(base))
        server.start()
        try:
            migrate(server.url)
            return dump(server.url)
        finally:
            server.stop()


def main() -> None:
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA
    target.write_text(generate(), encoding="utf-8")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
