"""How a Postgres error is judged: worth retrying or not (classify), for every adapter's caller."""

from __future__ import annotations

import psycopg

from worker.errors import DatabaseError, TransientError

# SQLSTATEs worth retrying: by class (08 connection, 40 serialization failure or deadlock,
# 53 insufficient resources such as a full disk, 57 operator intervention: shutdown, cancel,
# cannot connect now, 58 I/O error) and one by one. 25006: the database is read-only (a failover
# in progress, a managed database that went read-only on a full disk); 25P03 and 25P04: a session
# or transaction timeout ended the session; 55P03 and 55006: a lock or object is busy.
_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_TRANSIENT_STATES = frozenset({"25006", "25P03", "25P04", "55P03", "55006"})
_PERMANENT_STATES = frozenset({"57P04"})  # database_dropped: no retry brings it back


def classify(exc: psycopg.Error) -> TransientError | DatabaseError:
    """The one place a database error is judged: worth retrying (TransientError: the replica
    backs off and reports not ready), or not (DatabaseError: the replica stops, saying why).

    Without a SQLSTATE an OperationalError is the connection's (lost, refused, pool timeout)."""
    state = exc.sqlstate
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if state is None:
        if isinstance(exc, psycopg.OperationalError):
            return TransientError(f"postgres: {first}")
        return DatabaseError(f"postgres: {type(exc).__name__}: {first}")
    if state not in _PERMANENT_STATES and (state[:2] in _TRANSIENT_CLASSES or state in _TRANSIENT_STATES):
        return TransientError(f"postgres: {state} {first}")
    return DatabaseError(f"postgres refused ({state} {type(exc).__name__}): {first}")
