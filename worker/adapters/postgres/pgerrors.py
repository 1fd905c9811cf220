"""How a Postgres error is judged: worth retrying or not (classify)."""

from __future__ import annotations

import psycopg

from worker.errors import DatabaseError, TransientError

# SQLSTATEs worth retrying: by class (connection, serialization, resources, operator intervention,
# I/O) and one by one (a read-only database, a session timeout, a busy lock or object).
_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_TRANSIENT_STATES = frozenset({"25006", "25P03", "25P04", "55P03", "55006"})
_PERMANENT_STATES = frozenset({"57P04"})  # database_dropped: no retry brings it back


def classify(exc: psycopg.Error) -> TransientError | DatabaseError:
    """The one place a database error is judged: TransientError (back off, not ready) or
    DatabaseError (stop, saying why). With no SQLSTATE, an OperationalError is the connection's."""
    state = exc.sqlstate
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if state is None:
        if isinstance(exc, psycopg.OperationalError):
            return TransientError(f"postgres: {first}")
        return DatabaseError(f"postgres: {type(exc).__name__}: {first}")
    if state not in _PERMANENT_STATES and (state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES):
        return TransientError(f"postgres: {state} {first}")
    return DatabaseError(f"postgres refused ({state} {type(exc).__name__}): {first}")
