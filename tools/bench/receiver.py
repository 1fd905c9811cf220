"""The soak's consumer in a process of its own, as a user's is (in the bench's, its pauses were
counted as lateness), and the bench's reading of the file it writes (a pipe would fill and block
it while the bench is busy)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import IO, Any

from tools.bench.rig import python_child
from worker.contract import Subjects
from worker.devkit.recorder import Firing, Received, Recorder

ENV = "BENCH_RECEIVER"  # the consumer's settings, JSON: in its environment, not its command line
READY = b"ready\n"
READY_TIMEOUT_S = 60.0  # the child's start on a busy machine: its imports and its connection


def consume() -> None:
    """The child's entry: each event received and acknowledged, a line `[serviceCallId, dueAt,
    received]` appended to the file $BENCH_RECEIVER names, until killed."""
    settings = json.loads(os.environ[ENV])
    with open(settings.pop("out"), "a", buffering=1) as out:  # a line at a time: read whole by the bench
        asyncio.run(_consume(out, **settings))


async def _consume(out: IO[str], nats_url: str, prefix: str, stream: str, durable: str) -> None:
    def keep(received_at: float, msg: Received) -> None:
        e = Firing.of(received_at, msg)
        out.write(json.dumps([e.service_call_id, e.due_at, e.received_at]) + "\n")

    recorder = Recorder(nats_url, Subjects(prefix).due("*"), stream, keep, durable)
    await recorder.start()
    os.write(1, READY)
    await asyncio.Event().wait()  # receiving until killed


class Receiver:
    """The consumer's process (ended with the `async with` block) and its new complete lines."""

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
        """(serviceCallId, dueAt, received) written since the last call; a partial line waits."""
        if self._file is None:
            self._file = self.out.open(encoding="utf-8")
        *lines, self._partial = (self._partial + self._file.read()).split("\n")
        return [_record(json.loads(line)) for line in lines]

    @property
    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


def _record(fields: list[Any]) -> tuple[str, float, float]:
    key, due, received = fields
    return str(key), float(due), float(received)
