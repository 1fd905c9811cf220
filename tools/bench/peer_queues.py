"""graphile-worker and pgqueuer beside this service (peers.py): installed into a throwaway
directory, run as worker processes whose no-op handlers append their receipts to files."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from tools.bench.peer_systems import Measured, Meter, Receipt, Shared, drain_timeout, lead_s
from tools.bench.realistic import DUE_AT_SQL
from tools.bench.rig import Progress, admin
from tools.bench.shapes import SHAPES, AddJobs, JobTable, build

PROGRAMS = Path(__file__).resolve().parent / "programs"  # run from the repository; peers installed apart
GRAPHILE_WORKER = "graphile-worker@0.18"
PGQUEUER = "pgqueuer[asyncpg]"
WORKERS = 2  # worker processes for each peer (--replicas for this service)


class FileWorkers:
    """Peer worker processes, each appending "due received" lines to its own file."""

    def __init__(self, workdir: Path, argv: Callable[[Path], list[str]], env: dict[str, str]) -> None:
        self.workdir, self.argv, self.env = workdir, argv, env
        self.procs: list[subprocess.Popen[bytes]] = []
        self.files: list[Path] = []
        self._offsets: dict[Path, int] = {}
        self.receipts: list[Receipt] = []

    def start(self, n: int) -> None:
        for i in range(len(self.procs), len(self.procs) + n):
            with open(self.workdir / f"worker-{i}.log", "ab") as log:  # the child keeps its own copy
                self.procs.append(
                    subprocess.Popen(
                        self.argv(self.workdir / f"worker-{i}.receipts"),
                        env=self.env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )
            self.files.append(self.workdir / f"worker-{i}.receipts")

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.poll() is None]

    async def ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self._all_ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"peer workers did not come up; logs in {self.workdir}")
            await asyncio.sleep(0.05)

    def _all_ready(self) -> bool:
        return all(Path(f"{f}.ready").exists() for f in self.files)

    def count(self) -> int:
        for f in self.files:
            with contextlib.suppress(FileNotFoundError), f.open("rb") as fh:
                fh.seek(self._offsets.get(f, 0))
                data = fh.read()
                whole = data[: data.rfind(b"\n") + 1]
                self._offsets[f] = self._offsets.get(f, 0) + len(whole)
                for line in whole.splitlines():
                    due, received = line.split()
                    self.receipts.append((float(due), float(received)))
        return len(self.receipts)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class _PeerOnPostgres:
    """What graphile-worker and pgqueuer share: a fresh database, N jobs, workers that write receipts."""

    name: str
    table: JobTable  # where its jobs are stored
    shapes: tuple[str, ...] = SHAPES

    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    def install(self, db_url: str) -> None:
        raise NotImplementedError

    def add_jobs(self, db_url: str, rows: int, every: int, start_s: float, rate: float) -> None:
        """The peer's own insert of `rows` jobs (an AddJobs)."""
        raise NotImplementedError

    def worker_argv(self, out: Path) -> list[str]:
        raise NotImplementedError

    def env(self, db_url: str) -> dict[str, str]:
        return {**os.environ, "PEER_DATABASE_URL": db_url, "PGDSN": db_url}  # PGDSN: for `pgq`

    async def drain(self, n: int, shape: str, big: int) -> Measured:
        pages = float("nan")

        def prepare(db_url: str) -> None:
            nonlocal pages
            add: AddJobs = functools.partial(self.add_jobs, db_url)
            pages = build(shape, db_url, add, self.table, n, big)

        measured = await self._run(n, prepare, after_insert=True, timeout=drain_timeout(n))
        measured.due_pages = pages
        return measured

    async def lateness(self, rate: int, seconds: float) -> Measured:
        n = int(rate * seconds)

        def insert(db_url: str) -> None:
            self.add_jobs(db_url, n, 1, lead_s(n), rate)

        return await self._run(n, insert, after_insert=False, timeout=seconds + 120)

    async def _run(
        self, n: int, insert: Callable[[str], None], after_insert: bool, timeout: float
    ) -> Measured:
        dbname, db_url = self.shared.fresh_db()
        workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.shared.workdir))
        workers = FileWorkers(workdir, self.worker_argv, self.env(db_url))
        try:
            await asyncio.to_thread(self.install, db_url)
            if after_insert:
                await asyncio.to_thread(insert, db_url)
            workers.start(WORKERS)
            await workers.ready()
            if not after_insert:
                await asyncio.to_thread(insert, db_url)
            meter = Meter(self.shared, workers.pids, consumer=False)
            await meter.wait(workers.count, n, timeout, self.shared.progress, self.name)
            return meter.result(workers.receipts)
        finally:
            await asyncio.to_thread(workers.stop)
            await asyncio.to_thread(
                admin, self.shared.admin_url, f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)'
            )


# graphile-worker's own bulk insert, jobs numbered lo .. hi, due as DUE_AT_SQL says.
GRAPHILE_INSERT = f"""
SELECT graphile_worker.add_jobs(array_agg(
  ROW('noop', json_build_object('d', extract(epoch FROM t)), NULL, t, NULL, NULL, NULL, NULL)
    ::graphile_worker.job_spec))
FROM (SELECT {DUE_AT_SQL} AS t FROM generate_series(%(lo)s::int, %(hi)s::int) AS i) AS due
"""
GRAPHILE_CHUNK = 50_000  # jobs per add_jobs call: one array per statement, of a manageable size


class GraphileWorker(_PeerOnPostgres):
    name = "graphile-worker"
    table = JobTable("graphile_worker._private_jobs", "run_at <= now()")

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self.dir = shared.tools / "graphile"

    def install(self, db_url: str) -> None:
        argv = [str(self.dir / "node_modules/.bin/graphile-worker"), "--schema-only", "-c", db_url]
        subprocess.run(argv, cwd=self.dir, check=True, capture_output=True)

    def add_jobs(self, db_url: str, rows: int, every: int, start_s: float, rate: float) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            for lo in range(1, rows + 1, GRAPHILE_CHUNK):
                params = {"every": every, "start_s": start_s, "rate": rate}
                conn.execute(GRAPHILE_INSERT, params | {"lo": lo, "hi": min(lo + GRAPHILE_CHUNK - 1, rows)})

    def worker_argv(self, out: Path) -> list[str]:
        return ["node", str(PROGRAMS / "graphile_worker.js"), str(out)]

    def env(self, db_url: str) -> dict[str, str]:
        return {**super().env(db_url), "NODE_PATH": str(self.dir / "node_modules")}  # for `require`


class PgQueuer(_PeerOnPostgres):
    name = "pgqueuer"
    table = JobTable("pgqueuer", "execute_after <= now()")  # its default name

    def __init__(self, shared: Shared) -> None:
        super().__init__(shared)
        self.dir = shared.tools / "pgqueuer"
        self.python = str(self.dir / "venv/bin/python")
        self.program = str(PROGRAMS / "pgqueuer_worker.py")

    def install(self, db_url: str) -> None:
        subprocess.run(
            [str(self.dir / "venv/bin/pgq"), "install"], env=self.env(db_url), check=True, capture_output=True
        )

    def add_jobs(self, db_url: str, rows: int, every: int, start_s: float, rate: float) -> None:
        argv = [self.python, self.program, "insert", str(rows), str(every), str(start_s), str(rate)]
        subprocess.run(argv, env=self.env(db_url), check=True, capture_output=True)

    def worker_argv(self, out: Path) -> list[str]:
        return [self.python, self.program, "work", str(out)]


def install_peers(tools: Path, chosen: list[str], progress: Progress) -> dict[str, str]:
    """npm and pip installs of the chosen peers into `tools` (kept there with --tools); their versions."""
    versions: dict[str, str] = {}
    graphile, pgq = tools / "graphile", tools / "pgqueuer"
    if "graphile-worker" in chosen:
        if not shutil.which("npm"):
            raise RuntimeError("graphile-worker needs Node.js and npm on PATH")
        if not (graphile / "node_modules/graphile-worker").exists():
            graphile.mkdir(parents=True, exist_ok=True)
            progress(f"npm install {GRAPHILE_WORKER} into {graphile}")
            npm = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", GRAPHILE_WORKER]
            subprocess.run(npm, cwd=graphile, check=True, stdout=subprocess.DEVNULL)
        package = json.loads((graphile / "node_modules/graphile-worker/package.json").read_text())
        versions |= {"graphile-worker": package["version"], "node": _output(["node", "--version"])}
    if "pgqueuer" in chosen:
        if not (pgq / "venv/bin/pgq").exists():
            progress(f"pip install {PGQUEUER} into {pgq}/venv")
            subprocess.run([sys.executable, "-m", "venv", str(pgq / "venv")], check=True)
            pip = [str(pgq / "venv/bin/pip"), "install", "--quiet", "--disable-pip-version-check", PGQUEUER]
            subprocess.run(pip, check=True, stdout=subprocess.DEVNULL)
        show = [str(pgq / "venv/bin/python"), "-c", "import pgqueuer; print(pgqueuer.__version__)"]
        versions["pgqueuer"] = _output(show)
    return versions


def _output(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.strip()
