"""The pull requests a due_events reader keeps open on its durable consumer: how several readers
of one durable share its events, each asking only for what it can take."""

from __future__ import annotations

import json
import re
from typing import Any

# Events one reader asks for at a time, at most: asked for again once half are given out (as
# nats.go's Consume does), so a reader holds at most this many received and not given out, and
# the readers of one durable take turns at the stream rather than one taking everything.
PULL_BATCH = 512
# How long a request waits on the server for events: a quiet tenant's reader asks again this often.
EXPIRES_S = 30.0
# While a request waits, the server says so this often: two missed and the reader looks whether its
# connection and its consumer are still there (consumer.py, _still_there).
HEARTBEAT_S = 5.0
# A status that ends a request normally: expired (408), or ended short by its batch's byte or count
# bound (409 with the count it did not deliver). Any other (no responders, the consumer deleted
# or made push-based, a leader change, too many waiting requests) is not answered by asking again
# at once, which would loop on the server's refusal: the reader asks again after the next silence.
_ENDED = frozenset({b"408", b"409"})
# A consumer made by hand with a cap on a request's batch refuses a larger one: asked within it.
_MAX_BATCH = re.compile(r"Exceeded MaxRequestBatch of (\d+)")


class Pulls:
    """The events asked for and not yet given out (delivered or not), and whether to ask again."""

    __slots__ = ("batch", "inbox", "refused", "subject", "wanted")

    def __init__(self, stream: str, durable: str, inbox: str, batch: int = PULL_BATCH) -> None:
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.inbox = inbox
        self.batch = batch
        self.wanted = 0  # asked for: delivered and not given out, or not delivered yet
        self.refused = False  # a request was refused: none again before the next silence

    def given(self) -> None:
        # (never below none: after a silence that was only a slow server, a request asked for
        # before it may still deliver)
        self.wanted = max(0, self.wanted - 1)

    def ended(self, code: bytes, pending: int | None, description: str = "") -> None:
        """A status on the inbox (an idle heartbeat, 100, changes nothing): `pending`, the events a
        request ended without delivering (its Nats-Pending-Messages)."""
        if code == b"100":
            return
        if code in _ENDED and pending is not None:
            self.wanted = max(0, self.wanted - pending)
            return
        if (cap := _MAX_BATCH.search(description)) is not None:
            self.batch = max(1, int(cap.group(1)))
        self.refused = True

    def anew(self, held: int) -> None:
        """After a silence (no request left on the server: it restarted, the connection came back),
        with `held` events received and not given out: asked for afresh."""
        self.wanted, self.refused = held, False

    async def top_up(self, nc: Any) -> None:
        """Ask for more once half of what was asked for is given out."""
        if self.refused or self.wanted > self.batch // 2:
            return
        request = {
            "batch": self.batch - self.wanted,
            "expires": int(EXPIRES_S * 1e9),
            "idle_heartbeat": int(HEARTBEAT_S * 1e9),
        }
        await nc.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)
        self.wanted = self.batch
