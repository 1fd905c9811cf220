"""wire.publish_all: a batch in one write must be exactly what nats-py's `publish`, one message
at a time, puts on the wire: the same bytes, stats, errors (after the same messages), reconnect
buffering; and nats-py's own path wherever this one does not fit. No server: a client marked
connected, without a flusher, leaves its commands in `_pending`, where nats-py's own land too."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client as NATS

from worker.client import wire
from worker.client.wire import Message, encode, publish_all


def connected(status: int = NATS.CONNECTED, *, max_payload: int = 1 << 20, pending: int = 0) -> NATS:
    nc = NATS()
    nc._status = status
    nc._max_payload = max_payload
    nc._max_pending_size = pending  # 0: no reconnect buffering (nats-py's default is 2 MiB)
    return nc


async def one_by_one(nc: NATS, messages: list[Message]) -> BaseException | None:
    try:
        for subject, payload, reply, headers in messages:
            await nc.publish(subject, payload, reply=reply, headers=headers)
    except Exception as exc:
        return exc
    return None


async def in_one_write(nc: NATS, messages: list[Message]) -> BaseException | None:
    try:
        await publish_all(nc, messages)
    except Exception as exc:
        return exc
    return None


def outcome(nc: NATS, error: BaseException | None) -> tuple[Any, ...]:
    return b"".join(nc._pending), dict(nc.stats), type(error), str(error) if error else None


async def both(messages: list[Message], **client: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    ours, theirs = connected(**client), connected(**client)
    got = outcome(ours, await in_one_write(ours, messages))
    want = outcome(theirs, await one_by_one(theirs, messages))
    return got, want


BATCH: list[Message] = [
    ("svc.acme.timer.schedule", b'{"a": 1}', "", {"Nats-Msg-Id": "id-1", "Nats-Batch-Id": "b"}),
    ("svc.acme.timer.due", "dû à 9 h ✓".encode(), "_INBOX.x.7.500.fail.2.1.$FI", None),
    ("svc.acme.timer.due", b"", "", {}),
    ("svc.acme.timer.due", b"x", "_INBOX.y", {f"K-{i}": f" v{i} " for i in range(40)}),
    ("svc.acme.timer.due", b"y", "", {" Trace ": " a\r\nb ", "  ": "blank key skipped", "É": "x"}),
]


def test_the_wire_is_byte_for_byte_nats_pys() -> None:
    # É is not a token character: kept out of the batch sent in one write (it is an error case below)
    messages = [m for m in BATCH if not (m[3] and "É" in m[3])]
    messages.append(("svc.acme.timer.due", b"y", "", {" Trace ": " a\r\nb ", "  ": "skipped", "tp": "ü"}))
    got, want = asyncio.run(both(messages))
    assert got == want
    assert want[0].count(b"PUB ") == len(messages)  # every message went out
    assert want[1]["out_msgs"] == len(messages)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.from_regex(r"\$JS\.ACK\.[A-Z_]{1,9}\.[a-z-]{1,9}(\.[0-9]{1,19}){6}", fullmatch=True), max_size=8
    ),
    st.sampled_from([b"", b"-NAK", b"+TERM"]),
)
def test_acknowledgements_are_what_nats_py_sends(replies: list[str], body: bytes) -> None:
    async def run() -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        ours, theirs = connected(), connected()
        await wire.acknowledge(ours, [r.encode() for r in replies], body)
        for reply in replies:
            await theirs.publish(reply, body)
        return outcome(ours, None), outcome(theirs, None)

    got, want = asyncio.run(run())
    assert got == want


header_keys = st.text(alphabet="!#$%&'*+-.^_`|~09AZaz ", min_size=0, max_size=12)
header_values = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
subjects = st.text(alphabet="abcXYZ09._-*>$é", min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            subjects,
            st.binary(max_size=64),
            st.one_of(st.just(""), subjects),
            st.one_of(st.none(), st.dictionaries(header_keys, header_values, max_size=6)),
        ),
        max_size=8,
    )
)
def test_any_batch_is_what_nats_py_sends(messages: list[Message]) -> None:
    got, want = asyncio.run(both(messages))
    assert got == want


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (("svc.acme timer", b"x", "", None), nats.errors.BadSubjectError),
        (("svc.acme.timer", b"x", "reply\r\nPUB evil 0", None), nats.errors.BadSubjectError),
        (("svc.acme.timer", b"x", "re\tply", None), nats.errors.BadSubjectError),  # each whitespace alone
        (("svc.acme.timer", b"x", "re\nply", None), nats.errors.BadSubjectError),
        (("svc.acme.timer", b"x", "re\rply", None), nats.errors.BadSubjectError),
        (("svc.acme.timer", b"x", "re ply", None), nats.errors.BadSubjectError),
        (("", b"x", "", None), nats.errors.BadSubjectError),
        (("svc.acme.timer", b"x", "", {"Bad Key": "v"}), nats.errors.BadHeaderError),
        (("svc.acme.timer", b"x", "", {"K:\r\nPUB": "v"}), nats.errors.BadHeaderError),
        (("svc.acme.timer", b"x" * 2000, "", None), nats.errors.MaxPayloadError),
        (("svc.acme.timer", b"x", "", {"K": "\ud800"}), UnicodeEncodeError),  # not UTF-8
        (("svc.acme.timer", b"x", "", {"K": 5}), AttributeError),  # not text: nats-py calls strip
    ],
)
def test_a_refused_message_raises_nats_pys_error_after_those_before_it_went_out(
    bad: Message, error: type[Exception]
) -> None:
    messages = [BATCH[0], BATCH[1], bad, BATCH[3]]
    got, want = asyncio.run(both(messages, max_payload=1024))
    assert want[2] is error
    assert want[1]["out_msgs"] == 2  # the two before it, not the one after
    assert got == want


@pytest.mark.parametrize(
    ("status", "pending", "error"),
    [
        (NATS.RECONNECTING, 1 << 20, None),  # buffered until the connection is back
        (NATS.RECONNECTING, 100, nats.errors.OutboundBufferLimitError),  # the buffer's bound
        (NATS.RECONNECTING, 0, nats.errors.OutboundBufferLimitError),  # buffering off
        (NATS.CLOSED, 0, nats.errors.ConnectionClosedError),
        (NATS.DRAINING_PUBS, 0, nats.errors.ConnectionDrainingError),
    ],
)
def test_a_connection_not_open_behaves_as_with_nats_pys_publish(
    status: int, pending: int, error: type[Exception] | None
) -> None:
    got, want = asyncio.run(both(BATCH[:4], status=status, pending=pending))
    assert want[2] is (type(None) if error is None else error)
    assert got == want


class Recording(NATS):
    """A client that counts its public publishes (the path a batch falls back to)."""

    def __init__(self) -> None:
        super().__init__()
        self.published = 0

    async def publish(self, *args: Any, **kwargs: Any) -> None:
        self.published += 1
        await super().publish(*args, **kwargs)


def recording() -> Recording:
    nc = Recording()
    nc._status = NATS.CONNECTED
    nc._max_payload = 1 << 20
    return nc


def test_one_write_when_nats_py_fits() -> None:
    nc = recording()
    asyncio.run(publish_all(nc, BATCH[:4]))
    assert nc.published == 0
    assert len(nc._pending) == 1  # one command for the whole batch


def test_a_nats_py_without_an_internal_this_relies_on_gets_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire, "_CLIENT_NEEDS", (*wire._CLIENT_NEEDS, "_renamed_in_a_later_version"))
    nc, twin = recording(), connected()
    asyncio.run(publish_all(nc, BATCH[:4]))
    asyncio.run(one_by_one(twin, BATCH[:4]))
    assert nc.published == 4
    assert outcome(nc, None) == outcome(twin, None)


def test_a_nats_py_that_encodes_differently_gets_publish(monkeypatch: pytest.MonkeyPatch) -> None:
    """_wire_matches compares encode with this nats-py's _send_publish once per process."""
    sent = NATS._send_publish

    async def changed(self: NATS, subject: str, reply: str, payload: bytes, size: int, headers: Any) -> None:
        await sent(self, subject, reply, payload + b"!", size + 1, headers)

    monkeypatch.setattr(NATS, "_send_publish", changed)
    monkeypatch.setattr(wire, "_wire_ok", None)
    nc = recording()
    asyncio.run(publish_all(nc, BATCH[:2]))
    assert nc.published == 2
    assert wire._wire_ok is False
    monkeypatch.setattr(wire, "_wire_ok", None)  # the real nats-py again, for the next tests


def test_encode_is_what_nats_py_sends_today() -> None:
    assert asyncio.run(wire._wire_matches()) is True
    assert encode([("a.b", b"hi", "r", {"K": "v"}), ("a", b"", "", None)]) == (
        b"HPUB a.b r 18 20\r\nNATS/1.0\r\nK: v\r\n\r\nhi\r\nPUB a  0\r\n\r\n",
        2,
    )


def test_replies_are_scanned_for_what_this_nats_py_refuses_and_its_own_check_runs_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # This nats-py refuses whitespace in a reply: publish_all scans for it instead of its regex.
    assert wire._SUBJECT_WHITESPACE == " \t\r\n"
    bad: Message = ("svc.acme.timer", b"x", "re\u2028ply", None)  # what the scan does not look for
    got, want = asyncio.run(both([BATCH[0], BATCH[1], bad]))
    assert got == want and want[2] is type(None)
    # A nats-py whose check is another (here: this one's) gets its check run on the joined replies.
    monkeypatch.setattr(wire, "_SUBJECT_WHITESPACE", None)
    for reply in ("ok.reply", "re\tply"):
        got, want = asyncio.run(both([BATCH[0], BATCH[1], ("svc.acme.timer", b"x", reply, None)]))
        assert got == want
    assert want[2] is nats.errors.BadSubjectError
