"""The test servers: the fixtures' ones answer, and the embedded ones survive crashes and die with us."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Literal, LiteralString

import nats
import psycopg
import pytest

from tests.servers import delete_streams, fresh_database
from worker.config import Settings
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres
from worker.devkit.polling import until
from worker.devkit.process import free_port


def scalar(url: str, query: LiteralString, *params: Any) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return row[0]


def execute(url: str, query: LiteralString) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(query)


def test_postgres_answers_and_the_test_database_is_migrated(pg_server_url: str, db_url: str) -> None:
    assert scalar(pg_server_url, "SELECT 1") == 1
    assert scalar(db_url, "SELECT to_regclass('timers') IS NOT NULL") is True
    assert scalar(db_url, "SELECT count(*) FROM timers") == 0


def test_each_db_url_is_a_database_of_its_own(db_url: str, pg_server_url: str) -> None:
    with fresh_database(pg_server_url) as other:
        assert other != db_url
        assert scalar(db_url, "SELECT current_database()") != scalar(other, "SELECT current_database()")
        execute(db_url, "CREATE TABLE only_here (n int)")
        assert scalar(other, "SELECT to_regclass('only_here') IS NULL") is True
        assert scalar(other, "SELECT to_regclass('timers') IS NOT NULL") is True


async def test_nats_has_jetstream(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().account_info()
    finally:
        await nc.close()
    assert info.limits is not None


def _taken(port: int) -> socket.socket:
    """A listening socket on 127.0.0.1:`port`: another process that bound it first."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", port))
    sock.listen()
    return sock


def test_a_server_whose_picked_port_was_taken_meanwhile_starts_on_another(tmp_path: Path) -> None:
    """free_port only says a port was free a moment ago: a parallel test's server took one between
    the pick and nats-server's bind, and the start failed. A port picked here moves; a given one
    (or any after the first start, whose URL is out) fails, saying why."""
    pg = EmbeddedPostgres(tmp_path / "pg")
    ns = EmbeddedNats(tmp_path / "ns")
    picked = (pg.port, ns.port)
    with _taken(pg.port), _taken(ns.port), pg, ns:
        assert pg.port != picked[0] and ns.port != picked[1]
        assert scalar(pg.url, "SELECT 1") == 1
        assert "address already in use" in (tmp_path / "ns" / "nats.log").read_text().lower()
    with _taken(ns.port), pytest.raises(RuntimeError, match="address already in use"):
        ns.start()  # after its first start: the URL stays, so it does not move
    given = EmbeddedNats(tmp_path / "given", port=free_port())
    with _taken(given.port), pytest.raises(RuntimeError, match="address already in use"):
        given.start()


def test_postgres_recovers_committed_rows_after_kill(tmp_path: Path) -> None:
    with EmbeddedPostgres(tmp_path / "pg") as pg:
        execute(pg.url, "CREATE TABLE survivors AS SELECT generate_series(1, 1000) AS n")
        busy = psycopg.connect(pg.url, autocommit=True)  # a backend alive when the server dies
        busy.execute("SELECT 1")
        port = pg.port
        pg.kill()
        with pytest.raises(psycopg.OperationalError):
            busy.execute("SELECT 1")
        busy.close()
        pg.start()
        assert pg.port == port
        assert scalar(pg.url, "SELECT count(*) FROM survivors") == 1000
    assert not pg.running


def test_postgres_restarts_after_fast_and_immediate_stops(tmp_path: Path) -> None:
    with EmbeddedPostgres(tmp_path / "pg", fsync=True) as pg:
        execute(pg.url, "CREATE TABLE t AS SELECT 1 AS n")
        modes: tuple[Literal["fast", "immediate"], ...] = ("fast", "immediate")
        for mode in modes:
            pg.stop(mode)
            assert not pg.running
            pg.start()
            assert scalar(pg.url, "SELECT n FROM t") == 1


async def test_nats_keeps_a_streams_messages_across_kill_and_restart(tmp_path: Path) -> None:
    with EmbeddedNats(tmp_path / "nats", sync_always=True) as server:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        acks = await asyncio.gather(*[js.publish(f"keep.{i}", str(i).encode()) for i in range(100)])
        await nc.close()
        assert sorted(a.seq for a in acks) == list(range(1, 101))

        server.kill()
        server.start()

        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            assert (await js.stream_info("KEEP")).state.messages == 100
            sub = await js.pull_subscribe("keep.>", durable="reader", stream="KEEP")
            seen: list[int] = []
            while len(seen) < 100:
                for msg in await sub.fetch(100, timeout=5):
                    seen.append(int(msg.data))
                    await msg.ack()
            assert sorted(seen) == list(range(100))
        finally:
            await nc.close()


_ORPHAN = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres
    pg = EmbeddedPostgres(Path(sys.argv[1]) / "pg"); pg.start()
    ns = EmbeddedNats(Path(sys.argv[1]) / "nats"); ns.start()
    print(pg.pid, ns.pid, flush=True)
    sys.stdin.read()
    """
)


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_servers_die_with_the_process_that_started_them(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).parents[3],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])},
    )
    assert owner.stdout is not None
    pids = [int(p) for p in owner.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    owner.kill()  # SIGKILL: no atexit, no context manager; only the kernel can clean up
    owner.wait()
    until(lambda: not any(_alive(p) for p in pids), timeout=15, what="servers to die with their parent")


async def test_settings_are_per_test_and_their_streams_are_deleted(settings: Settings, nats_url: str) -> None:
    tag = settings.subject_prefix
    streams = (settings.command_stream, settings.event_stream, settings.dlq_stream)
    assert all(name.startswith(tag) for name in (*streams, settings.consumer))
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        for name in streams:
            await js.add_stream(name=name, subjects=[f"{tag}.{name}.>"])
        await js.add_stream(name="OTHER_" + tag, subjects=[f"{tag}.other.>"])
        await js.add_stream(name="UNRELATED_" + tag, subjects=[f"x{tag}.>"])
        await delete_streams(nats_url, tag)
        left = {info.config.name for info in await js.streams_info()}
        assert left & {*streams, "OTHER_" + tag} == set()
        assert "UNRELATED_" + tag in left
        await js.delete_stream("UNRELATED_" + tag)
    finally:
        await nc.close()


def test_dev_live_line_before_anything_fired_shows_no_nan() -> None:
    from worker.devkit.dev import live_line

    nothing = {"scheduled": 3, "fired": 0, "duplicates": 0}
    line = live_line(nothing | {"p50_lateness_ms": float("nan"), "p99_lateness_ms": float("nan")}, 2.5)
    assert "nan" not in line and "p50=-ms" in line and line.lstrip().startswith("2.5s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups as a terminal makes them")
def test_ctrl_c_on_dev_stops_cleanly_and_counts_nothing_lost(tmp_path: Path) -> None:
    """Ctrl-C reaches the whole foreground process group (dev, its replicas, its servers)."""
    import signal

    env = {k: v for k, v in os.environ.items() if not k.startswith("TIMER_")}
    dev = subprocess.Popen(
        [sys.executable, "-m", "worker", "dev", "--replicas", "1", "--rate", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env | {"TMPDIR": str(tmp_path)},
        start_new_session=True,  # a process group of its own, as a shell's foreground job
    )
    assert dev.stdout is not None
    for line in dev.stdout:  # the live view, one line a second off a terminal
        if " fired=" in line and " fired=0 " not in line:
            break
    os.killpg(dev.pid, signal.SIGINT)
    out, err = dev.communicate(timeout=60)
    assert dev.returncode == 0, (out, err)
    last = out.strip().splitlines()[-1]
    assert last.startswith("stopped: scheduled=") and "pending=" in last and "lost" not in out, out
