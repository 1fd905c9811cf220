"""A message the broker delivered, as the core reads it. Protocols, not a type of ours: nats-py's Msg
satisfies them without a copy, and the core never imports the library."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Protocol

from worker import metrics
from worker.core.domain import Position
from worker.errors import verdict

log = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# Properties where nats-py's members are read-only: a protocol's plain attribute must be settable.


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
    """A message a stream's consumer delivered: its ack subject says where and when it was stored."""

    reply: str

    @property
    def metadata(self) -> Delivery: ...


class ReceivedCommand(Delivered, Protocol):
    """A command from the command stream, and how intake answers it."""

    subject: str
    data: bytes
    headers: dict[str, str] | None

    async def ack(self) -> None: ...

    async def nak(self, delay: float | None = None) -> None:
        """Offer it again, after `delay` seconds (None: at once)."""

    async def in_progress(self) -> None:
        """Still being worked on: the consumer's ack wait starts again."""


class Request(Protocol):
    """A core-NATS request (the read model's `get`), answered on `reply`."""

    subject: str
    reply: str
    data: bytes

    async def respond(self, data: bytes) -> None: ...


def stored_time(msg: Delivered, *, truncated: bool = False) -> datetime:
    """When the stream stored `msg`, in the reading each kind of Nats-Msg-Id was made from, so that a
    redelivery or replay gives the same id: by default nats-py's float seconds; `truncated`, the
    nanoseconds cut to the microsecond, as the message-get API gives them."""
    if not truncated:
        return msg.metadata.timestamp
    found = _ack_tokens(msg.reply)
    if found is None or not found[1].isdigit():
        return msg.metadata.timestamp
    return EPOCH + timedelta(microseconds=int(found[1]) // 1000)


def _ack_tokens(reply: str | None) -> tuple[str, str] | None:
    """(stream sequence, stored nanoseconds) from an ack subject, unchecked; None for an unknown shape."""
    tokens = (reply or "").split(".")
    if len(tokens) == 9:
        return tokens[5], tokens[7]
    if len(tokens) >= 11:  # with a domain and an account hash
        return tokens[7], tokens[9]
    return None


def position(msg: ReceivedCommand) -> Position:
    """The command's place in the command stream, read from the ack subject with nats-py's own
    arithmetic; cheaper than Msg.metadata, which builds a frozen dataclass per message."""
    reply = msg.reply or ""
    if reply.startswith("$JS.ACK.") and (found := _ack_tokens(reply)) is not None:
        seq, nanos = found
        if seq.isdigit() and nanos.isdigit():
            return Position(int(seq), datetime.fromtimestamp(int(nanos) / 1_000_000_000.0, UTC))
    return Position(msg.metadata.sequence.stream, stored_time(msg))


async def answer(msg: ReceivedCommand, retry_in: float | None = None) -> None:
    """Acknowledge a command (retry_in None) or offer it again after retry_in seconds. A transient
    failure is logged, never raised: the command comes back after the ack wait and, idempotent, is
    answered then."""
    try:
        await (msg.ack() if retry_in is None else msg.nak(delay=retry_in))
    except Exception as exc:
        if verdict(exc) != "transient":
            raise
        metrics.COMMAND_SETTLE_FAILED.inc()
        # Logged at debug only: in an outage every command of a batch meets it.
        log.debug("command not settled", extra={"action": "settle_failed", "error": f"{type(exc).__name__}"})
