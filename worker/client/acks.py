"""What due_events (consumer.py) owes the server: the acknowledgements not yet sent, and the events
given out and not acknowledged, pruned of deliveries a later one superseded."""

from __future__ import annotations

import asyncio
from typing import Any

from worker.client.wire import acknowledge

# An event not acknowledged within the ack wait comes again with a reply subject of its own: once
# a reader holds this many events given out and not acknowledged (then twice what it kept), the
# deliveries that a later one of the same event superseded are dropped (Acks.forget_superseded).
_OPEN_FLOOR = 1024


class Acks:
    """The acknowledgements not yet sent, and the events given out and not acknowledged."""

    __slots__ = ("closed", "done", "open", "prune_at", "wake")

    def __init__(self) -> None:
        self.done: list[bytes] = []  # reply subjects
        self.open: dict[bytes, None] = {}
        self.wake: asyncio.Event | None = None  # while the reader waits for events: what wakes it
        self.prune_at = _OPEN_FLOOR  # forget_superseded once `open` holds more
        self.closed = False  # the loop ended: what was open was handed back

    def forget_superseded(self) -> None:
        """Drop the deliveries of events that came again since: the server acknowledges an event
        by its stream sequence, whichever delivery's reply the ack goes to, and the last delivery
        stays. Without this a handler that keeps failing on an event (caught, not acknowledged)
        made the reader hold one more reply subject per ack wait, for ever. Looked over when
        `open` doubled since, so a cost per event of nothing but a length check."""
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
        for reply in superseded:  # (their ack() still goes out: the server takes it for the event)
            del self.open[reply]
        self.prune_at = max(_OPEN_FLOOR, 2 * len(self.open))

    async def send(self, nc: Any) -> None:
        if self.done:  # an empty message is an ack (+ACK)
            replies, self.done = self.done, []
            await acknowledge(nc, replies)


def _delivery(reply: bytes) -> tuple[bytes, int] | None:
    """An ack subject's stream sequence and delivery count: `$JS.ACK.<stream>.<consumer>.
    <delivered>.<stream seq>.<consumer seq>.<timestamp>.<pending>`, or the form with a domain and
    an account hash after `$JS.ACK` and a token at the end (ADR-15). None for another form."""
    tokens = reply.split(b".")
    at = 4 if len(tokens) == 9 else 6 if len(tokens) >= 11 else None
    if at is None or not tokens[at].isdigit():
        return None
    return tokens[at + 1], int(tokens[at])
