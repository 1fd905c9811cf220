"""What due_events owes the server: acks to send, events given out."""

from __future__ import annotations

import asyncio
from typing import Any

from worker.client.wire import acknowledge

# Open events past which superseded deliveries are dropped (then twice what was kept).
_OPEN_FLOOR = 1024


class Acks:
    __slots__ = ("closed", "done", "open", "prune_at", "wake")

    def __init__(self) -> None:
        self.done: list[bytes] = []  # reply subjects
        self.open: dict[bytes, None] = {}
        self.wake: asyncio.Event | None = None  # set while the reader waits
        self.prune_at = _OPEN_FLOOR
        self.closed = False  # the loop ended: what was open was handed back

    def forget_superseded(self) -> None:
        """Drop deliveries a later one of the same event superseded (the server acks by stream
        sequence), so an event never acknowledged does not grow `open` each ack wait."""
        latest: dict[bytes, tuple[int, bytes]] = {}  # stream sequence: its last delivery
        superseded: list[bytes] = []
        for reply in self.open:
            if (at := _delivery(reply)) is None:
                continue
            seq, count = at
            if (seen := latest.get(seq)) is None:
                latest[seq] = (count, reply)
            elif count > seen[0]:
                superseded.append(seen[1])
                latest[seq] = (count, reply)
            else:
                superseded.append(reply)
        for reply in superseded:  # their ack() still counts for the event
            del self.open[reply]
        self.prune_at = max(_OPEN_FLOOR, 2 * len(self.open))

    async def send(self, nc: Any) -> None:
        if self.done:  # an empty message is an ack (+ACK)
            replies, self.done = self.done, []
            await acknowledge(nc, replies)


def _delivery(reply: bytes) -> tuple[bytes, int] | None:
    """An ack subject's stream sequence and delivery count (ADR-15), else None."""
    tokens = reply.split(b".")
    at = 4 if len(tokens) == 9 else 6 if len(tokens) >= 11 else None
    if at is None or not tokens[at].isdigit():
        return None
    return tokens[at + 1], int(tokens[at])
