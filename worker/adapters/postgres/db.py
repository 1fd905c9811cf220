"""The one place a database connection is opened, with every session pin (UTC, UTF8, the timestamp
loaders, autocommit): the pool, the operator's reads and the migrations connect here."""

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
    """timestamptz, or None for a value no datetime holds ('infinity', a year outside 1..9999): one
    such row must not make a claim unreadable."""

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
    """Why libpq would not take `conninfo`, or None: the kind of fault only, as libpq quotes the
    offending part, which may be the password."""
    try:
        conninfo_to_dict(conninfo)
    except psycopg.ProgrammingError as exc:
        return str(exc).split(":")[0]
    return None


def session_conninfo(conninfo: str) -> str:
    """The conninfo with the session's pins. TimeZone=UTC: west of UTC, 0001-01-01T00:00Z is no
    Python datetime. client_encoding=UTF8: a database or role may set one that cannot send an id."""
    given = conninfo_to_dict(conninfo)
    options = f"{given.get('options') or ''} -c TimeZone=UTC".strip()
    # Both ends notice a silent peer in about 30 s, not the system's 15 minutes, unless the URL says.
    for name, value in SERVER_TCP.items():
        if f"{name}=" not in options:
            options += f" -c {name}={value}"
    client = {k: v for k, v in CLIENT_TCP.items() if k not in given}
    return make_conninfo(conninfo, options=options, client_encoding="UTF8", **client)


def require_utf8(conninfo: str | psycopg.Connection[Any]) -> None:
    """Refuse a database not encoded UTF8 (ConfigError): SQL_ASCII returns bytes, LATIN1 cannot
    store most ids. On the session given, or one of its own."""
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
    """One autocommit session with the session's pins (the CLI's, the migrations')."""
    with psycopg.connect(session_conninfo(conninfo), autocommit=True, context=ADAPTERS) as conn:
        if read_only:
            conn.read_only = True
        yield conn


def fleet_secret(conninfo: str | psycopg.Connection[Any]) -> bytes:
    """The key of every Nats-Msg-Id (contract.MessageIds), read here alone: at start and by a DLQ replay."""
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


# How long the pool retries one lost connection before it gives up and Refill starts another try.
RECONNECT_S = 1.0


class Refill:
    """The pool's reconnect_failed: a lost connection retried about every second, not with
    psycopg_pool's doubling delay, so a failover's new primary is reached at once."""

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
    """The replica's pool, not yet open. idle_in_transaction_session_timeout is the lease of a
    claim open across its publish: a frozen replica's claim is rolled back."""
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
