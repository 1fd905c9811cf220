"""A server as a child process that cannot outlive us (an atexit hook; on Linux, PR_SET_PDEATHSIG):
its own process group, its output in a log, a start that waits until it answers."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Literal, Self, TypedDict

from worker.devkit.polling import until

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.05
RESTART_RETRY_S = 5.0
PORT_MOVES = 3  # new ports tried after a start found its picked one taken
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

_live: set[ServerProcess] = set()


def free_port(prefer: int = 0) -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: `prefer` if it was, else any."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", prefer))
        except OSError:
            sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@atexit.register
def _kill_leftovers() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.kill()


def _die_with_parent(sig: int) -> Callable[[], None] | None:
    """A preexec_fn after which the child gets `sig` when its parent dies (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # before fork: no dlopen in the child
    parent = os.getpid()

    def preexec() -> None:
        # After the switch of user, which would clear the setting.
        prctl(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _ChildIO(TypedDict):
    stdin: int
    stdout: BinaryIO
    stderr: int
    cwd: Path
    user: str | None


class ServerProcess:
    """One server process in its own process group, its output appended to `log_path`."""

    name = "server"

    def __init__(self, base_dir: Path, port: int | None) -> None:
        self.base_dir = Path(base_dir).absolute()
        self.port = port or free_port()
        self.log_path = self.base_dir / f"{self.name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._ports_ours = port is None  # may move until the first start
        self._started = False
        self._moves = 0

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc else None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        """SIGKILL the server and every process of its group (a crash); data stays for start()."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._forget()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.stop()
        finally:
            self.kill()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} port={self.port} pid={self.pid} dir={self.base_dir}>"

    def _spawn(
        self, argv: list[str], *, user: str | None, death_signal: int, env: Mapping[str, str] | None = None
    ) -> None:
        """Start the server; `env`: variables on top of ours."""
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                **self._child_io(log, user),
                env=None if env is None else {**os.environ, **env},
                start_new_session=True,  # own process group: kill() takes the children too
                preexec_fn=_die_with_parent(death_signal),
            )
        _live.add(self)

    def _run(self, argv: list[str], *, user: str | None, timeout: float) -> int:
        """Run one of the server's programs (initdb) to its end; its exit code."""
        with self.log_path.open("ab") as log:
            return subprocess.run(argv, **self._child_io(log, user), timeout=timeout, check=False).returncode

    def _child_io(self, log: BinaryIO, user: str | None) -> _ChildIO:
        return {
            "stdin": subprocess.DEVNULL,
            "stdout": log,
            "stderr": subprocess.STDOUT,
            "cwd": self.base_dir,
            "user": user,
        }

    def _wait_ready(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Poll `ready` until it holds (True) or the process exits (False); raise at deadline."""

        def state() -> Literal["ready", "exited"] | None:
            if not self.running:
                return "exited"
            return "ready" if ready() else None

        try:
            found = until(
                state,
                deadline - time.monotonic(),
                lambda: f"{self.name} to be ready; {self._log_tail()}",
                POLL_S,
            )
        except TimeoutError:
            self.kill()
            raise
        if found == "exited":
            self._forget()
            return False
        self._started = True
        return True

    def _signal_and_wait(self, sig: int) -> None:
        """Send `sig`, wait for the exit; kill() if it takes longer than STOP_TIMEOUT_S."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(sig)
        try:
            self._proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
        self._forget()

    def _moved_from_a_taken_port(self) -> bool:
        """After a failed start: True, on new ports, when the log says one was taken (free_port's
        may be bound meanwhile). Only before the first start: URLs handed out must stay valid."""
        if not self._ports_ours or self._started or self._moves >= PORT_MOVES:
            return False
        if "address already in use" not in self._log_tail(8).lower():
            return False
        self._moves += 1
        self._pick_ports()
        return True

    def _pick_ports(self) -> None:
        self.port = free_port()

    def _forget(self) -> None:
        self._proc = None
        _live.discard(self)

    def _log_tail(self, lines: int = 15) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return f"no log at {self.log_path}"
        return f"last lines of {self.log_path}:\n" + "\n".join(tail)
