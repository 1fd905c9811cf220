"""A PostgreSQL primary and a streaming hot standby, as platform teams run them (CloudNativePG,
Patroni, a managed service's failover), both real servers on loopback.

The standby is a `pg_basebackup -R` copy of the primary (the -R writes `primary_conninfo` and
`standby.signal`), so it streams the primary's WAL from the start, through a TCP proxy
(tests/chaos/proxy.py) that can hold the stream back: a standby falling behind. With `synchronous=True` the
primary waits, at every commit, until the standby has flushed the commit's WAL
(`synchronous_standby_names = '*'`, `synchronous_commit = on`): a commit the primary reports is
on both. Without it, a commit is reported once it is on the primary alone.

Failover is what an operator does: the primary is SIGKILLed (its host died), the standby is
promoted (`pg_promote()`, the SQL form of `pg_ctl promote`). Clients find the new primary through
a multi-host URL with `target_session_attrs=read-write`: libpq tries each host in turn and keeps
the one that accepts writes.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from pathlib import Path
from types import TracebackType
from typing import LiteralString, Self

import psycopg

from tests.chaos.proxy import Proxy
from worker.devkit.embedded import EmbeddedPostgres, postgres_bin, system_user_for
from worker.devkit.polling import until

DBNAME = "timers"
STALL_HOLD_S = 60.0  # held back longer than any scenario waits: until the primary dies
POLL_S = 0.05


class PgPair:
    def __init__(self, base_dir: Path, *, synchronous: bool) -> None:
        self.synchronous = synchronous
        self.primary = EmbeddedPostgres(base_dir / "a")
        self.standby = EmbeddedPostgres(base_dir / "b")
        self.link: Proxy | None = None  # the replication connection, standby to primary

    @property
    def url(self) -> str:
        """Both servers, the writable one wins: what the replicas and the checker use."""
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return f"postgresql://postgres@{hosts}/{DBNAME}?target_session_attrs=read-write&connect_timeout=2"

    def start(self) -> None:
        self.primary.start()
        self.link = Proxy("127.0.0.1", self.primary.port)
        self.link.start()
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DBNAME}")
        self._base_backup()
        self.standby.start()
        if self.synchronous:
            # Set after the copy, so only the primary has it: a promoted standby with no standby
            # of its own would otherwise wait for one at every commit (an operator resets it too).
            with psycopg.connect(self.primary.url, autocommit=True) as conn:
                conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
                conn.execute("SELECT pg_reload_conf()")
        want = "sync" if self.synchronous else "async"
        until(
            lambda: self._sync_state() == want,
            timeout=30,
            what=f"the standby streaming ({want})",
            interval=POLL_S,
        )

    def _base_backup(self) -> None:
        target = self.standby.data_dir
        self.standby.base_dir.mkdir(parents=True, exist_ok=True)
        user = system_user_for(self.standby.base_dir)
        target.mkdir(mode=0o700)  # pg_basebackup fills an empty directory the server user owns
        if user:
            shutil.chown(target, user, user)
        assert self.link is not None
        # Through the proxy: the primary_conninfo that -R writes names the proxy's port.
        argv = [str(postgres_bin() / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.link.port)]
        argv += ["-U", "postgres", "-D", str(target), "-R", "-X", "stream", "--checkpoint=fast", "--no-sync"]
        done = subprocess.run(argv, user=user, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"pg_basebackup failed: {done.stderr}"

    def _sync_state(self) -> str | None:
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            row = conn.execute("SELECT sync_state FROM pg_stat_replication").fetchone()
        return str(row[0]) if row else None

    def wait_replayed(self) -> None:
        """Until the standby has replayed everything the primary had written when this was called:
        every commit made before it is on both."""
        with psycopg.connect(self.primary.url, autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        assert row is not None
        lsn = str(row[0])

        def replayed() -> bool:
            with psycopg.connect(self.standby.url, autocommit=True) as conn:
                done = conn.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)).fetchone()
            return bool(done and done[0])

        until(replayed, timeout=60, what=f"the standby replaying the primary's WAL to {lsn}", interval=POLL_S)

    def stall_replication(self) -> None:
        """Hold the WAL stream back in the proxy (a slow network or disk on the standby's side):
        with synchronous replication commits then wait; without, they go on alone."""
        assert self.link is not None
        self.link.set_latency(STALL_HOLD_S)

    def cut_replication(self) -> None:
        """Drop the replication connection and whatever WAL it still held: the primary's host is
        gone, and with it what it had sent and the standby had not yet received."""
        if self.link is not None:
            self.link.drop_all()
            self.link.set_latency(0)
            self.link.refuse(True)

    def kill_primary(self) -> None:
        """SIGKILL the primary and its backends: its host died."""
        self.primary.kill()
        self.cut_replication()

    def standby_reads(self, query: LiteralString) -> object:
        """One value read on the (hot) standby: what it has replayed."""
        with psycopg.connect(self.standby.url_for(DBNAME), autocommit=True) as conn:
            row = conn.execute(query).fetchone()
        return row[0] if row else None

    def promote(self) -> None:
        """The standby becomes the primary; returns once it accepts writes."""
        with psycopg.connect(self.standby.url, autocommit=True) as conn:
            conn.execute("SELECT pg_promote(wait => true, wait_seconds => 30)")

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        if self.link is not None:
            self.link.stop()
        for server in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                server.stop("immediate")
            server.kill()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
