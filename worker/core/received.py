"""A message the broker delivered, as the core reads it: a command intake applies, a `get` the read
model answers, and when the stream stored it.

Protocols, not a type of ours: nats-py's Msg satisfies them as it is, so the broker hands the core
its messages without a copy each (intake takes thousands a second), and the core never imports the
library. What a loop reads of a message is all it may read: the protocols list it.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Protocol

from worker import metrics
from worker.core.domain import Position
from worker.errors import verdict

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# Plain attributes where nats-py's Msg has plain ones; properties where its members are read-only
# (Msg.metadata, the frozen Msg.Metadata): a protocol's plain attribute must be settable.


class StreamSequence(Protocol):
    @property
    def stream(self) -> int: ...


class Delivery(Protocol):
    """Where and when the stream stored a delivered message (nats-py's Msg.Metadata)."""

    @property
    def sequence(self) -> StreamSequence: ...
    @property
    def timestamp(self) -> datetime: ...


class Delivered(Protocol):
    """A message a consumer of a stream delivered: its ack subject (`reply`) says where and when
    the stream stored it, `metadata` reads that."""

    reply: str

    @property
    def metadata(self) -> Delivery: ...


class ReceivedCommand(Delivered, Protocol):
    """A command from the command stream: what intake parses, and how it answers it (ack or nak)."""

    subject: str
    data: bytes
    headers: dict[str, str] | None

    async def ack(self) -> None: ...

    async def nak(self, delay: float | None = None) -> None:
        """Offer it again, after `delay` seconds (None: at once)."""

    async def in_progress(self) -> None:
        """Still being worked on: the consumer's ack wait starts again."""


class Request(Protocol):
    """A core-NATS request (the read model's `get`): answered on `reply`, when there is one."""

    subject: str
    reply: str
    data: bytes

    async def respond(self, data: bytes) -> None: ...


def stored_time(msg: Delivered, *, truncated: bool = False) -> datetime:
    """When the stream stored `msg`. Two readings, each the one a kind of Nats-Msg-Id has always
    been made from (contract.MessageIds.derived), so neither may change: a redelivered command, or
    an entry replayed again, must give the id it gave before.

    - by default nats-py's (Msg.metadata): the nanoseconds as float seconds, rounded to the
      microsecond. A command's Position (`position`) is, and its DLQ copy's id is made from that.
    - `truncated`: the nanoseconds cut to the microsecond, as the message-get API's time is. A
      replay's id is made from it, so an entry listed and an entry got by its sequence (ops.dlq)
      give the same one. Read from the ack subject,
      `$JS.ACK.<stream>.<consumer>.<delivered>.<seq>.<cseq>.<ns>.<pending>`, or with a domain and
      account hash before the stream and a token after the pending count (one that holds no time
      falls back on the default reading).
    """
    if not truncated:
        return msg.metadata.timestamp
    found = _ack_tokens(msg.reply)
    if found is None or not found[1].isdigit():
        return msg.metadata.timestamp
    return EPOCH + timedelta(microseconds=int(found[1]) // 1000)


def _ack_tokens(reply: str | None) -> tuple[str, str] | None:
    """(the stream sequence, the stored time in nanoseconds) as an ack subject writes them (see
    stored_time for its two shapes), unchecked; None for a subject of neither shape."""
    tokens = (reply or "").split(".")
    if len(tokens) == 9:
        return tokens[5], tokens[7]
    if len(tokens) >= 11:  # with a domain and an account hash
        return tokens[7], tokens[9]
    return None


def position(msg: ReceivedCommand) -> Position:
    """The command's place in the command stream (domain.Position).

    Read from the ack subject directly, with nats-py's own arithmetic (so a redelivered command
    gets the Position, and its DLQ copy the id, it always got): Msg.metadata builds a frozen
    dataclass of eight fields per message, a few microseconds that intake paid for every
    command (issue 21's profile). A subject of another shape is left to Msg.metadata."""
    reply = msg.reply or ""
    if reply.startswith("$JS.ACK.") and (found := _ack_tokens(reply)) is not None:
        seq, nanos = found
        if seq.isdigit() and nanos.isdigit():
            return Position(int(seq), datetime.fromtimestamp(int(nanos) / 1_000_000_000.0, UTC))
    return Position(msg.metadata.sequence.stream, stored_time(msg))


async def answer(msg: ReceivedCommand, retry_in: float | None = None) -> None:
    """Acknowledge a command (retry_in None) or offer it again after retry_in seconds. When NATS
    cannot take that now (reconnecting, with TIMER_PUBLISH_BUFFER_BYTES too small to hold it),
    nothing is lost: the command comes back after the consumer's ack wait and, being idempotent,
    is answered then. So a transient failure here is logged, never raised. (Metric and log
    action keep the word settle: names operators' alerts and queries use.)"""
    try:
        await (msg.ack() if retry_in is None else msg.nak(delay=retry_in))
    except Exception as exc:
        if verdict(exc) != "transient":
            raise
        metrics.COMMAND_SETTLE_FAILED.inc()
        # Counted, and logged at debug only: in an outage every command of a batch meets it.
        log.debug("command not settled", extra={"action": "settle_failed", "error": f"{type(exc).__name__}"})
