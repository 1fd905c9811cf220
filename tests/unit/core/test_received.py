"""What the core reads of a delivered message (worker/core/received.py): nats-py's Msg satisfies
the protocols as it is, and the stored time is read the two ways the Nats-Msg-Ids were made from."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from worker.core.domain import Position
from worker.core.received import ReceivedCommand, position, stored_time

# 2026-11-24T05:00:00.000001700Z: its nanoseconds round up to ...002 µs and truncate to ...001.
NANOS = 1_795_496_400_000_001_700


def delivered(reply: str) -> Msg:
    return Msg(_client=None, subject="timer.acme.timer.schedule", reply=reply, data=b"{}")  # type: ignore[arg-type]


def test_the_default_reading_is_nats_pys_and_truncated_is_the_message_get_apis() -> None:
    msg = delivered(f"$JS.ACK.CMDS.timer-service.1.42.7.{NANOS}.0")
    assert stored_time(msg) == msg.metadata.timestamp  # what DLQ copies' ids were made from
    assert stored_time(msg) == datetime(2026, 11, 24, 5, 0, 0, 2, tzinfo=UTC)
    assert stored_time(msg, truncated=True) == datetime(2026, 11, 24, 5, 0, 0, 1, tzinfo=UTC)


def test_the_truncated_reading_of_an_ack_subject_with_a_domain() -> None:
    msg = delivered(f"$JS.ACK.hub.acchash.CMDS.timer-service.1.42.7.{NANOS}.0.token")
    assert stored_time(msg, truncated=True) == datetime(2026, 11, 24, 5, 0, 0, 1, tzinfo=UTC)


def test_a_commands_position_is_its_stream_sequence_and_the_default_reading() -> None:
    msg: ReceivedCommand = delivered(f"$JS.ACK.CMDS.timer-service.1.42.7.{NANOS}.0")
    assert position(msg) == Position(42, datetime(2026, 11, 24, 5, 0, 0, 2, tzinfo=UTC))


def test_a_position_read_from_the_ack_subject_is_the_one_nats_pys_metadata_gives() -> None:
    """position() parses the ack subject itself (the hot path); it must never disagree with
    Msg.metadata, which every earlier Position and DLQ copy's id was made from."""
    rng = random.Random(21)
    nanos = [0, 1, 999, NANOS, 1_700_000_000_999_999_999, 4_102_444_800_000_000_000]
    nanos += [rng.randrange(0, 4_102_444_800_000_000_000) for _ in range(5000)]
    for n in nanos:
        seq = rng.randrange(1, 2**63)
        for reply in (
            f"$JS.ACK.CMDS.timer-service.3.{seq}.7.{n}.12",
            f"$JS.ACK.hub.acchash.CMDS.timer-service.3.{seq}.7.{n}.12.token",
            f"$JS.ACK._.acchash.CMDS.timer-service.3.{seq}.7.{n}.12",
        ):
            msg = delivered(reply)
            assert position(msg) == Position(msg.metadata.sequence.stream, msg.metadata.timestamp), reply


def test_a_reply_that_is_no_ack_subject_is_left_to_nats_py() -> None:
    with pytest.raises(NotJSMessageError):
        position(delivered("_INBOX.abc.1"))
