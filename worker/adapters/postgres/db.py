"""The one place a database connection is opened, with every session pin: the session's TimeZone
is UTC, its client_encoding UTF8, timestamps load through the service's adapters, autocommit.
The replica's pool, the operator's reads and the migrations all connect through here."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from typing import Any

import psycopg
from psycopg.abc import AdaptContext, Buffer
from psycopg.adapt import AdaptersMap, Loader
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.pq import Format
from psycopg_pool import AsyncConnectionPool, PoolClosed

from worker.adapters.postgres.queries import QUERIES
from worker.errors import ConfigError, DatabaseError


class _SafeTimestamptz(Loader):
    """timestamptz as psycopg loads it, or None for a value no datetime holds ('infinity', a year
    outside 1..9999): one such row must not make a whole claim unreadable (README, dueAt)."""

    def __init__(self, oid: int, context: AdaptContext | None = None) -> None:
        super().__init__(oid, context)
        builtin = psycopg.adapters.get_loader(oid, self.format)
        assert builtin is not None
        self._load = builtin(oid, context).load  # the C loader: the claim path stays fast

    def load(self, data: Buffer) -> datetime | None:
        try:
            value: datetime = self._load(data)
        except psycopg.DataError:
            return None
        return value


class _SafeTimestamptzText(_SafeTimestamptz):
    format = Format.TEXT


class _SafeTimestamptzBinary(_SafeTimestamptz):
    format = Format.BINARY


# Every connection of the service adapts through this: psycopg's defaults but _SafeTimestamptz.
ADAPTERS = AdaptersMap(psycopg.adapters)
ADAPTERS.register_loader("timestamptz", _SafeTimestamptzText)
ADAPTERS.register_loader("timestamptz", _SafeTimestamptzBinary)


CLIENT_TCP = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3,
              "tcp_user_timeout": 30_000}  # fmt: skip
SERVER_TCP = {"tcp_keepalives_idle": 10, "tcp_keepalives_interval": 5, "tcp_keepalives_count": 3,
              "tcp_user_timeout": 30_000}  # fmt: skip


def conninfo_fault(conninfo: str) -> str | None:
    """Why libpq would not take `conninfo`, or None: only the kind of fault, as libpq quotes the
    offending part, which may be the password."""
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        return str(exc).split(":")[0]
    return None


def session_conninfo(conninfo: str) -> str:
    """The conninfo with the session's pins, for every connection of the service (pool, migrations,
    operator tools). TimeZone=UTC: psycopg returns times in the session's zone, and west of UTC the
    instant 0001-01-01T00:00Z is no Python datetime: one such row then made every claim that met it
    fail. client_encoding=UTF8: a database or role may set another (ALTER DATABASE ... SET
    client_encoding), and then an id such as 注文-42 could not be sent; on a UTF8 database
    (require_utf8) this one converts nothing."""
    given = conninfo_to_dict(conninfo)
    options = f"{given.get('options') or ''} -c TimeZone=UTC".strip()
    # Both ends notice a peer gone silent (a host lost, a partition) within about 30 s rather
    # than the operating system's 15 minutes: this end through keepalives and tcp_user_timeout, a
    # COMMIT that would otherwise wait on a vanished primary; the server's end through its own,
    # a backend blocked writing a claim's rows to a vanished replica, its row locks held. Unless
    # the URL says otherwise.
    for name, value in SERVER_TCP.items():
        if f"{name}=" not in options:
            options += f" -c {name}={value}"
    client = {k: v for k, v in CLIENT_TCP.items() if k not in given}
    return make_conninfo(conninfo, options=options, client_encoding="UTF8", **client)


def require_utf8(conninfo: str | psycopg.Connection[Any]) -> None:
    """Refuse a database not encoded UTF8, with one line naming it (ConfigError). SQL_ASCII (what
    initdb gives under the C locale) stores bytes unchecked, so text comes back as bytes and a
    claimed row cannot be read; LATIN1 and the like cannot store most ids. Checked at start-up,
    before anything is written. On a session of `connect` given, or one of its own."""
    with session(conninfo) as conn:
        found = conn.execute(QUERIES["server_encoding"]).fetchone()
    if found is None:  # not possible: the current database is in pg_database
        return
    database, encoding = found
    if encoding != "UTF8":
        raise ConfigError(
            f"database {database} is encoded {encoding}; timer-service needs UTF8"
            " (CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0)"
        )


@contextmanager
def connect(conninfo: str, read_only: bool = False) -> Iterator[psycopg.Connection[Any]]:
    """One autocommit session in UTC with the service's adapters (the CLI's, the migrations')."""
    with psycopg.connect(session_conninfo(conninfo), autocommit=True, context=ADAPTERS) as conn:
        if read_only:
            conn.read_only = True
        yield conn


def fleet_secret(conninfo: str | psycopg.Connection[Any]) -> bytes:
    """The key of every Nats-Msg-Id (contract.MessageIds), made by sql/migrations/0005: read here
    alone, by the replica as it starts (on its start-up session, once the schema is checked) and
    by a DLQ replay (on a one-off read-only session)."""
    with session(conninfo, read_only=True) as conn:
        found = conn.execute(QUERIES["fleet_secret"]).fetchone()
    if found is None:
        raise DatabaseError(
            "the database has no fleet secret (table fleet_secret is empty): restore its row from a"
            " backup of this database"
        )
    return bytes(found[0])


@contextmanager
def session(
    given: str | psycopg.Connection[Any], read_only: bool = False
) -> Iterator[psycopg.Connection[Any]]:
    """The session given (left open), or a one-off one of `connect` for a conninfo."""
    if isinstance(given, str):
        with connect(given, read_only=read_only) as conn:
            yield conn
    else:
        yield given


# How long the pool retries one lost connection before it gives up on that attempt (and Refill
# starts another at once): the longest a replica waits to reconnect after the primary is back.
RECONNECT_S = 1.0


class Refill:
    """The pool's reconnect_failed: the pool's own attempts to replace a lost connection, bounded.

    psycopg_pool replaces a lost connection by retrying with a delay that doubles (1, 2, 4, 8,
    16 s ...) for reconnect_timeout (5 min by default). Through a failover that outlasts a few
    attempts (Patroni's leader ttl is 20 s at least) the next attempt then comes 8 to 16 s after
    the new primary is writable, and the replicas fire nothing meanwhile (measured: 8.1 s, in
    tests/chaos/test_patroni.py). With reconnect_timeout at RECONNECT_S an attempt gives up after
    a second, the pool counts the connection gone and calls this; check(), the pool's public way
    to verify what it holds, also grows it back by a connection (one growth at a time), whose
    first try is at once: one try about every second per pool, for as long as the outage lasts,
    and a connection to the new primary within a second of its first writable moment.

    A task of its own, one at a time: the pool calls this from one of its workers, and a check
    of idle connections on a host gone silent may take their TCP timeout."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None

    def __call__(self, pool: AsyncConnectionPool[Any]) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._check(pool), name="db-pool-refill")

    @staticmethod
    async def _check(pool: AsyncConnectionPool[Any]) -> None:
        with suppress(PoolClosed):  # the replica is stopping
            await pool.check()


def pool(
    conninfo: str, name: str, min_size: int, max_size: int, idle_in_transaction_ms: int
) -> AsyncConnectionPool[Any]:
    """The replica's pool, not yet open: autocommit sessions in UTC with the service's adapters,
    each named `name` in pg_stat_activity.

    idle_in_transaction_session_timeout is the lease of a batch in flight: a claim's transaction
    stays open across the publish (Store.claim), and a replica frozen mid-batch (SIGSTOP, a VM
    paused) would hold its rows locked for as long as it stays frozen. Past this timeout Postgres
    ends the session and rolls the claim back, and another replica claims the rows at once; the
    frozen replica, waking, can commit nothing. A batch that works goes idle in its transaction
    only while it publishes, which the publish timeout bounds below the lease (Settings)."""
    idle = f"idle_in_transaction_session_timeout={idle_in_transaction_ms}"
    return AsyncConnectionPool(
        _with_option(session_conninfo(conninfo), idle),
        min_size=min_size,
        max_size=max_size,
        open=False,
        reconnect_timeout=RECONNECT_S,
        reconnect_failed=Refill(),
        kwargs={
            "autocommit": True,
            "application_name": name[:63],
            "context": ADAPTERS,
        },
        name=name,
    )


def _with_option(conninfo: str, setting: str) -> str:
    options = conninfo_to_dict(conninfo).get("options") or ""
    return make_conninfo(conninfo, options=f"{options} -c {setting}".strip())
