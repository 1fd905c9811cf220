"""The soak's measuring consumer in a process of its own, as a user's consumer is, and the bench's
side of it: the first receipt of each timer, read back from the file the consumer writes.

In the bench's process the consumer shared one interpreter with the producers, the sampler and
the reading of the records: any pause of theirs (a pass over the run's records, the collector
walking them) delayed the receive times it took, and was counted as the service's lateness.
In its own process it does nothing but receive, take the time, write a line and acknowledge.
It writes to a file, not a pipe: a pipe fills while the bench is busy, and a full pipe would
block the consumer's write, and its next receive times, until the bench read it.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import IO, Any

from tools.bench.context import python_child
from worker.contract import Subjects
from worker.devkit.recorder import Firing, Received, Recorder

ENV = "BENCH_RECEIVER"  # the consumer's settings, JSON: in its environment, not its command line
READY = b"ready\n"
READY_TIMEOUT_S = 60.0  # the child's start on a busy machine: its imports and its connection


def consume() -> None:
    """The child's entry (python -c 'from tools.bench.receiver import consume; consume()'): the
    events as a user's consumer receives them (the client's due_events on a durable consumer, each
    acknowledged: the devkit's recorder), one JSON line `[serviceCallId, dueAt, received]` each
    (epoch seconds) appended to the file named in $BENCH_RECEIVER, until killed."""
    settings = json.loads(os.environ[ENV])
    with open(settings.pop("out"), "a", buffering=1) as out:  # a line at a time: read whole by the bench
        asyncio.run(_consume(out, **settings))


async def _consume(out: IO[str], nats_url: str, prefix: str, stream: str, durable: str) -> None:
    def keep(received_at: float, msg: Received) -> None:
        e = Firing.of(received_at, msg)
        out.write(json.dumps([e.service_call_id, e.due_at, e.received_at]) + "\n")
        # Nothing kept in this process (the recorder's list holds only these Nones): no heap for
        # the collector to walk, however long the run.

    recorder = Recorder(nats_url, Subjects(prefix).due("*"), stream, keep, durable)
    await recorder.start()
    os.write(1, READY)
    await asyncio.Event().wait()  # receiving until killed


class Receiver:
    """The consumer's process, and what it wrote so far: each new complete line, as it comes.
    Used with `async with`: the process ends with the block, however it ends."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.proc: asyncio.subprocess.Process | None = None
        self._file: IO[str] | None = None
        self._partial = ""

    async def __aenter__(self) -> Receiver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
        if self._file is not None:
            self._file.close()

    async def start(self, nats_url: str, prefix: str, stream: str, durable: str) -> None:
        """Until the consumer is receiving; RuntimeError when it could not start."""
        self.out.touch()
        settings = {"nats_url": nats_url, "prefix": prefix, "stream": stream, "durable": durable}
        self.proc = await python_child(
            "from tools.bench.receiver import consume; consume()",
            {ENV: json.dumps(settings | {"out": str(self.out)})},
        )
        assert self.proc.stdout is not None
        try:
            line = await asyncio.wait_for(self.proc.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line != READY:
            raise RuntimeError(f"the soak's consumer did not start (exit status {self.proc.returncode})")

    def take(self) -> list[tuple[str, float, float]]:
        """The records written since the last call: (serviceCallId, dueAt, received), in the order
        received. A line still being written is left for the next call."""
        if self._file is None:
            self._file = self.out.open(encoding="utf-8")
        *lines, self._partial = (self._partial + self._file.read()).split("\n")
        return [_record(json.loads(line)) for line in lines]

    @property
    def exited(self) -> int | None:
        """The consumer's exit status once it ended (it runs until stopped)."""
        return None if self.proc is None else self.proc.returncode

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def _record(fields: list[Any]) -> tuple[str, float, float]:
    key, due, received = fields
    return str(key), float(due), float(received)
