"""pgqueuer beside timer-service (tools/bench/peers.py runs it in pgqueuer's own throwaway venv).

`insert ROWS EVERY START_S RATE`: enqueue ROWS no-op jobs numbered from 1 with pgqueuer's own
enqueue; those whose number EVERY divides due from now + START_S at RATE per second, in order,
the others at a random moment 1 to 30 days ahead (as tools/bench/realistic.py, DUE_AT_SQL).
`work OUT`: a worker whose no-op entrypoint appends "due received" lines (epoch seconds) to OUT,
flushed every 50 ms; it creates OUT.ready once it runs, and stops on SIGTERM.
The database is PEER_DATABASE_URL.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import asyncpg
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job

DSN = os.environ["PEER_DATABASE_URL"]
ENQUEUE_CHUNK = 10_000  # jobs per enqueue call: one statement of a manageable size


def due_in(i: int, every: int, start_s: float, rate: float) -> timedelta:
    if i % every == 0:
        return timedelta(seconds=start_s + (i // every - 1) / rate)
    return timedelta(days=1) + random.random() * timedelta(days=29)


async def insert(rows: int, every: int, start_s: float, rate: float) -> None:
    conn = await asyncpg.connect(DSN)
    q = Queries(AsyncpgDriver(conn))
    for lo in range(1, rows + 1, ENQUEUE_CHUNK):
        after = [due_in(i, every, start_s, rate) for i in range(lo, min(lo + ENQUEUE_CHUNK, rows + 1))]
        k = len(after)
        await q.enqueue(["noop"] * k, [None] * k, [0] * k, after)
    await conn.close()


async def work(out: str) -> None:
    conn = await asyncpg.connect(DSN)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    buf: list[str] = []

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        buf.append(f"{job.execute_after.timestamp()} {time.time()}\n")

    def flush() -> None:
        if buf:
            with open(out, "a") as f:
                f.write("".join(buf))
            buf.clear()

    async def flusher() -> None:
        while True:
            await asyncio.sleep(0.05)
            flush()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    task = asyncio.create_task(flusher())
    await asyncio.to_thread(Path(out + ".ready").touch)  # peers.py waits for every worker's marker
    await qm.run(batch_size=100)
    task.cancel()
    flush()


if __name__ == "__main__":
    if sys.argv[1] == "insert":
        asyncio.run(insert(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])))
    else:
        asyncio.run(work(sys.argv[2]))
