"""The pull requests of due_events readers: each asks only for what it can take."""

from __future__ import annotations

import json
import re
from typing import Any

# Events a reader asks for at a time, again once half are given out: readers take turns.
PULL_BATCH = 512
# How long a request waits on the server for events.
EXPIRES_S = 30.0
# The server's idle heartbeat: two missed and the reader checks it is still there.
HEARTBEAT_S = 5.0
# Statuses that end a request normally; on any other, asked again only after a silence.
_ENDED = frozenset({b"408", b"409"})
# A consumer's own cap on a request's batch: asked within it.
_MAX_BATCH = re.compile(r"Exceeded MaxRequestBatch of (\d+)")


class Pulls:
    """The events asked for and not given out, and whether to ask again."""

    __slots__ = ("batch", "inbox", "refused", "subject", "wanted")

    def __init__(self, stream: str, durable: str, inbox: str, batch: int = PULL_BATCH) -> None:
        self.subject = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}"
        self.inbox = inbox
        self.batch = batch
        self.wanted = 0
        self.refused = False  # none again before the next silence

    def given(self) -> None:
        # never below 0: a request from before a silence may still deliver
        self.wanted = max(0, self.wanted - 1)

    def ended(self, code: bytes, pending: int | None, description: str = "") -> None:
        """A status on the inbox; `pending`: what the request left undelivered."""
        if code == b"100":
            return
        if code in _ENDED and pending is not None:
            self.wanted = max(0, self.wanted - pending)
            return
        if (cap := _MAX_BATCH.search(description)) is not None:
            self.batch = max(1, int(cap.group(1)))
        self.refused = True

    def anew(self, held: int) -> None:
        """After a silence, with `held` events received and not given out: ask afresh."""
        self.wanted, self.refused = held, False

    async def top_up(self, nc: Any) -> None:
        if self.refused or self.wanted > self.batch // 2:
            return
        request = {
            "batch": self.batch - self.wanted,
            "expires": int(EXPIRES_S * 1e9),
            "idle_heartbeat": int(HEARTBEAT_S * 1e9),
        }
        await nc.publish(self.subject, json.dumps(request).encode(), reply=self.inbox)
        self.wanted = self.batch
