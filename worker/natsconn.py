"""A NATS connection that never goes out in clear when TLS is configured, and the JetStream batch
wire protocols (atomic and fast-ingest): for the service and the producer client alike (so this
module needs nothing but nats-py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import nats.aio.client
import nats.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import api
from nats.js.errors import APIError, NoStreamResponseError


class _TlsEnforcingClient(NATS):
    """nats-py upgrades to TLS only when the server's INFO says `tls_required`: with TLS configured,
    a plaintext server (or one that merely allows TLS, or a man in the middle rewriting INFO) would
    get our CONNECT, credentials included, in clear. This client refuses instead."""

    async def _process_info(self, info: dict[str, Any], initial_connection: bool = False) -> None:
        wants_tls = self.options.get("tls") is not None and not self.options.get("tls_handshake_first")
        if initial_connection and wants_tls and not info.get("tls_required"):
            raise nats.errors.Error(
                "nats: TLS is configured but the server does not require it; not connecting in clear"
            )
        await super()._process_info(info, initial_connection)


async def nats_connect(servers: str | list[str], **options: Any) -> NATS:
    """nats.connect(), but never in clear when TLS is configured."""
    nc = _TlsEnforcingClient()
    await nc.connect(servers, **options)
    return nc


class Drainable(Protocol):
    """What close_within drains: a nats-py Subscription, or one with more to wait for."""

    def drain(self) -> Awaitable[None]: ...


# Of close_within's time, what the close keeps after the drain and flush: a server that answers
# takes a moment to close on; one that does not, no time at all.
CLOSE_SHARE = 0.25


async def close_within(nc: NATS, timeout: float, subscriptions: Iterable[Drainable] = ()) -> bool:
    """Drain these subscriptions (the messages they hold handled), flush what was published to the
    server and close `nc`, all within `timeout` seconds whatever the server does; whether every
    step finished in time. The close always runs: the socket goes, and what it still had to write
    is lost, as with a connection that breaks.

    Not nats-py's Client.drain: it swallows a cancellation and then waits on a flush of its own,
    10 s, so a timeout around it does not bound it (a server that stopped answering without
    resetting the connection, a partition or a frozen process, held a stopping replica 15 s past
    its drain timeout). Here each step is a task waited for with the time left; one out of time is
    cancelled (these steps end when cancelled) and not waited for."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout

    async def drain() -> None:
        if nc.is_connected:
            # One that cannot drain (unsubscribed already) keeps neither the others nor the flush.
            await asyncio.gather(*(s.drain() for s in subscriptions), return_exceptions=True)
            await nc.flush(timeout=max(deadline - loop.time(), 0.001))  # type: ignore[arg-type]  # a float

    drained = await _within(drain(), (1 - CLOSE_SHARE) * timeout)
    closed = nc.is_closed or await _within(nc.close(), deadline - loop.time())
    return drained and closed


async def _within(step: Awaitable[None], seconds: float) -> bool:
    """Whether `step` ended without an error within `seconds`; cancelled, and left, if not."""
    task = asyncio.ensure_future(step)
    done, _ = await asyncio.wait([task], timeout=max(seconds, 0))
    if not done:
        task.cancel()
        task.add_done_callback(_seen)  # its end, if it comes, is nobody's business now
        return False
    return not task.cancelled() and task.exception() is None


def _seen(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" at exit


# subject, reply, payload, header block (its `NATS/1.0…` line included) or None, as read
RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]


def take_raw(nc: NATS, sid: int, handler: RawHandler) -> Callable[[], None] | None:
    """Hand the messages of subscription `sid` to `handler` as the connection reads them, before
    nats-py makes a Msg of each, parses its headers and queues it for the subscription's task
    (half of a consumer's CPU per message). Returns the undo; None when this nats-py's parser
    does not go through `_process_msg` (the caller reads the subscription as usual).
    Every other subscription is untouched. The handler runs inside the read loop: it must not block."""
    process = getattr(nc, "_process_msg", None)
    if process is None or not asyncio.iscoroutinefunction(process):
        return None
    handlers: dict[int, RawHandler] | None = nc.__dict__.get("_raw_handlers")
    if handlers is None:
        routes: dict[int, RawHandler] = {}

        async def routed(sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
            if (to := routes.get(sid)) is None:
                await process(sid, subject, reply, data, headers)
            else:
                to(subject, reply, data, headers)

        nc.__dict__["_raw_handlers"] = handlers = routes
        nc.__dict__["_process_msg"] = routed  # the parser calls `self.nc._process_msg`
    handlers[sid] = handler

    def release() -> None:
        handlers.pop(sid, None)

    return release


# Publishing many messages in one write (issue 21): nats-py's `publish` costs, per message, the
# subject and reply checks, a regular expression per header key, a header block built piece by
# piece and a coroutine chain; 40 % of the producer's CPU. `publish_all` encodes a whole batch as
# nats-py would, message by message, byte for byte (tests/unit/test_natsconn_wire.py, and
# `_wire_matches` once per process against this nats-py's own `_send_publish`), and hands it to
# the connection as one command and one flush. What it needs of nats-py's internals:
_CLIENT_NEEDS = ("_send_publish", "_send_command", "_flush_pending")
_INSTANCE_NEEDS = ("_flush_queue", "_max_payload", "_skip_subject_validation", "stats", "_flusher_task")
_MODULE_NEEDS = ("_validate_subject", "_HEADER_KEY_RE")
_CRLF = b"\r\n"
_NEWLINES = str.maketrans({"\r": " ", "\n": " "})  # nats-py's: a value never ends its header line
# A header key's `Key: ` once checked (None: a blank key, which nats-py skips). Bounded: carried
# headers come from users; past the bound keys are checked each time, as nats-py does.
_KEYS: dict[str, str | None] = {}
_KEYS_MAX = 256
# What nats-py's publish refuses in a subject or reply (its _SUBJECT_INVALID_RE), when it is the
# whitespace this knows: found by one scan per character in the joined replies of a batch, at a
# hundredth of the regular expression's time. A nats-py with another check gets its own.
_INVALID = getattr(nats.aio.client, "_SUBJECT_INVALID_RE", None)
_SUBJECT_WHITESPACE = " \t\r\n" if _INVALID is not None and _INVALID.pattern == r"[ \t\r\n]" else None
_wire_ok: bool | None = None  # _wire_matches' verdict, once per process

Message = tuple[str, bytes, str, "dict[str, str] | None"]  # subject, payload, reply, headers


class _Slow(Exception):
    """Something nats-py refuses or handles one message at a time: the batch goes through `publish`."""


def _key(k: str) -> str | None:
    if (known := _KEYS.get(k, "")) != "":
        return known
    key = k.strip()
    if not key:
        encoded = None
    elif nats.aio.client._HEADER_KEY_RE.fullmatch(key):
        encoded = key + ": "
    else:
        raise _Slow  # nats-py raises BadHeaderError(key): let it, at the same message
    if len(_KEYS) < _KEYS_MAX:
        _KEYS[k] = encoded
    return encoded


def encode(messages: Sequence[Message], max_payload: int = 1 << 62) -> tuple[bytes, int]:
    """The PUB/HPUB commands nats-py's `_send_publish` makes of these messages, joined, and the
    size of their payloads. Raises _Slow for what nats-py refuses: an empty subject, a malformed
    header key, a payload over `max_payload`."""
    parts: list[bytes] = []
    add = parts.append
    known = _KEYS
    size = 0
    for subject, payload, reply, headers in messages:
        if not subject or len(payload) > max_payload:
            raise _Slow
        size += len(payload)
        if headers is None:
            add(f"PUB {subject} {reply} {len(payload)}\r\n".encode())
        else:
            # Built as text and encoded once with the protocol line: the header block's length is
            # its length in UTF-8, the text's own when it is ASCII (keys always are).
            hdr = "NATS/1.0\r\n"
            for k, v in headers.items():
                if (ks := known.get(k, "")) == "":
                    ks = _key(k)
                if ks is None:
                    continue
                value = v.strip()
                if "\r" in value or "\n" in value:
                    value = value.translate(_NEWLINES)
                hdr += f"{ks}{value}\r\n"
            hdr += "\r\n"
            n = len(hdr) if hdr.isascii() else len(hdr.encode())
            add(f"HPUB {subject} {reply} {n} {n + len(payload)}\r\n{hdr}".encode())
        add(payload)
        add(_CRLF)
    return b"".join(parts), size


def _fits(nc: NATS) -> bool:
    """Whether this nats-py has what publish_all relies on."""
    return (
        all(hasattr(NATS, a) for a in _CLIENT_NEEDS)
        and all(hasattr(nc, a) for a in _INSTANCE_NEEDS)
        and all(hasattr(nats.aio.client, a) for a in _MODULE_NEEDS)
    )


async def _wire_matches() -> bool:
    """Whether `encode` still makes what this nats-py's `_send_publish` makes (never connected, it
    leaves its commands in `_pending`): a nats-py that changed its encoding gets `publish`."""
    global _wire_ok
    if _wire_ok is None:
        sample: list[Message] = [
            ("a.b", b"x", "", None),
            ("a.b", b"\xc3\xa9", "_INBOX.r.1", {" K-1 ": " v\r\nw ", " ": "blank", "Nats-Msg-Id": "i"}),
            ("\u00e9.b", b"", "r", {"K": "d\u00fb \u2713", "L": ""}),
        ]
        try:
            probe = NATS()
            for subject, payload, reply, headers in sample:
                await probe._send_publish(subject, reply, payload, len(payload), headers)
            _wire_ok = b"".join(probe._pending) == encode(sample)[0]
        except Exception:  # an internal renamed or reshaped
            _wire_ok = False
    return _wire_ok


async def publish_all(nc: NATS, messages: Sequence[Message]) -> None:
    """`await nc.publish(subject, payload, reply, headers)` for each message in order, with the same
    bytes on the wire, errors, stats and reconnect buffering, at a fraction of the CPU: one write.

    Whatever nats-py handles message by message (not connected: its bounded reconnect buffer; a
    payload over the server's limit, a bad subject or header key: its error, raised after the
    messages before it went out), and a nats-py this does not fit, go through `publish` itself.
    """
    try:
        if not (_fits(nc) and await _wire_matches()) or not nc.is_connected or nc.is_draining_pubs:
            raise _Slow
        if not nc._skip_subject_validation:
            validate = nats.aio.client._validate_subject
            for subject in {m[0] for m in messages}:  # a batch has few: one per tenant
                validate(subject)
            # Replies differ per message (fast batches): checked joined, the same check, as
            # publish's is whitespace and emptiness (and "" means no reply, never checked).
            if (replies := "".join([m[2] for m in messages])) and (
                _SUBJECT_WHITESPACE is None or any(c in replies for c in _SUBJECT_WHITESPACE)
            ):
                validate(replies)
        command, size = encode(messages, nc._max_payload)
    # What nats-py refuses (BadSubjectError, BadHeaderError, MaxPayloadError, a header that is
    # not text...): its own publish raises it, at the same message, after those before it went out.
    except (_Slow, nats.errors.Error, AttributeError, TypeError, ValueError):
        for subject, payload, reply, headers in messages:
            await nc.publish(subject, payload, reply=reply, headers=headers)
        return
    if messages:
        await _write(nc, command, len(messages), size)


async def acknowledge(nc: NATS, replies: Sequence[bytes], body: bytes = b"") -> None:
    """`await nc.publish(reply.decode(), body)` for each reply subject a JetStream consumer was
    given (an empty body acknowledges, `-NAK` hands back), in one write, as publish_all. The
    subjects are the server's own, read off its MSG lines: never blank, never spaced, so there
    is nothing to check or encode, which is most of publish_all's cost per message."""
    if not replies:
        return
    if not (_fits(nc) and await _wire_matches()) or not nc.is_connected or nc.is_draining_pubs:
        for reply in replies:
            await nc.publish(reply.decode(), body)
        return
    rest = b"  %d\r\n%s\r\n" % (len(body), body)  # no reply of its own: nats-py's two spaces
    command = b"".join([b"PUB " + reply + rest for reply in replies])
    await _write(nc, command, len(replies), len(body) * len(replies))


async def _write(nc: NATS, command: bytes, count: int, size: int) -> None:
    """Hand `count` encoded PUBs of `size` payload bytes to nats-py's pending buffer, counted in its
    stats as its publish counts them, and wake its flusher as publish does."""
    nc.stats["out_msgs"] += count
    nc.stats["out_bytes"] += size
    await nc._send_command(command)
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


async def written(nc: NATS, wait: float = 1.0) -> None:
    """Until what was published on `nc` so far is handed to its socket, for at most `wait` seconds.
    nats-py writes from its own flusher task, at the publisher's next wait: a publisher going on
    with CPU work (building the next batch) would hold the last one back meanwhile, and the server
    would sit idle. A hint, never a guarantee: publishing's own errors and acks tell what was sent."""
    flusher = getattr(nc, "_flusher_task", None)
    if not (_fits(nc) and nc.is_connected) or nc._flush_queue is None or flusher is None or flusher.done():
        return  # not connected: nats-py buffers; no flusher: its publish wrote inline
    # nats-py's own way to kick its flusher (_flush_pending): a future in its queue, answered once
    # everything pending before it is written. A connection lost meanwhile may leave it unanswered.
    done = asyncio.get_running_loop().create_future()
    await nc._flush_queue.put(done)
    await asyncio.wait([done], timeout=wait)


# JetStream atomic batch publish (ADR-50, nats-server 2.12+), shared by the service's broker and
# the producer client: each message of a batch carries the batch id and its place in it, the last
# one the commit, and only the commit gets a reply, the batch's PubAck (all stored, or none).
ATOMIC_BATCH_MAX = 1000  # JetStream's limit on messages in one atomic batch
ERR_ATOMIC_DISABLED = 10174  # "atomic publish is disabled": the stream was made without allow_atomic


def atomic_batch_headers(
    headers: dict[str, str] | None, batch_id: str, seq: int, commit: bool
) -> dict[str, str]:
    """A message's headers as message `seq` (from 1) of atomic batch `batch_id`."""
    out = {**(headers or {}), "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq)}
    if commit:
        out["Nats-Batch-Commit"] = "1"
    return out


def atomic_batch_head(
    chunk: Sequence[tuple[str, bytes, dict[str, str] | None]], batch_id: str
) -> list[Message]:
    """Every message of atomic batch `batch_id` but its commit (the last of `chunk`, which is sent
    with atomic_batch_headers(..., commit=True) to get the batch's PubAck), for publish_all."""
    return [
        (subject, payload, "", atomic_batch_headers(headers, batch_id, seq, commit=False))
        for seq, (subject, payload, headers) in enumerate(chunk[:-1], start=1)
    ]


def batch_ack_error(reply: bytes, size: int) -> dict[str, Any] | None:
    """None when a batch's PubAck confirms all `size` messages; else the error it carries."""
    try:
        ack = json.loads(reply)
    except ValueError:
        return {"description": f"unreadable batch PubAck: {reply[:100]!r}"}
    if not isinstance(ack, dict):
        return {"description": f"unreadable batch PubAck: {reply[:100]!r}"}
    if "error" in ack:
        return dict(ack["error"])
    if ack.get("count") != size:
        return {"description": f"batch PubAck counts {ack.get('count')} of {size}"}
    return None


# Fast-ingest batch publish (ADR-50's "fast" batches, allow_batched streams, nats-server 2.14+),
# shared by the service's broker (events) and the producer client (commands).
FAST_INGEST_SINCE = (2, 14)
# nats-py knows the allow_batched stream setting since 2.13 (the oldest supported, 2.12, does not:
# with it, everything goes in atomic batches).
CLIENT_KNOWS_BATCHED = "allow_batched" in {f.name for f in dataclasses.fields(api.StreamConfig)}
# "batch publish is disabled": the stream has no allow_batched (any more).
ERR_BATCH_DISABLED = 10205
# Errors that say nothing against a message, only against its batch (disabled, pattern invalid,
# batch id invalid or unknown, too many batches in flight): such a message goes again one by one.
ERR_BATCH_ONLY = {ERR_BATCH_DISABLED, 10206, 10207, 10208, 10211}
# The flow-control ack the server may send every N stored messages of a fast batch, at most: what
# a batch cut short by a timeout keeps. 500 is the server's own ceiling.
FAST_FLOW = 500


def server_has_fast_ingest(nc: NATS | None) -> bool:
    """Whether the server `nc` is connected to, and this nats-py, know fast-ingest batches."""
    if not CLIENT_KNOWS_BATCHED or nc is None or not nc.is_connected:
        return False
    try:
        version = nc.connected_server_version
        return (version.major, version.minor) >= FAST_INGEST_SINCE
    except (TypeError, ValueError, AttributeError):  # no version in the server's INFO
        return False


def api_error(error: dict[str, Any]) -> APIError:
    """The error a PubAck carries. nats-py's APIError.from_error raises it rather than return it,
    which took a whole bulk publish down with one refused message."""
    try:
        APIError.from_error(error)
    except APIError as exc:
        return exc
    return APIError(description=str(error))  # pragma: no cover  # from_error always raises


# A message of a fast batch the server never stored, though it refused no message of its own
# (a later one of a batch ended by another's error, or all of a batch refused whole): sent again.
AGAIN = Exception("send again")


@dataclasses.dataclass
class FastBatch:
    """What the server said so far of one fast batch (FastBatches)."""

    id: str
    size: int
    done: asyncio.Future[None]
    flowed: int = 0  # the highest flow ack: messages 1..flowed are stored
    count: int | None = None  # the PubAck's: messages 1..count are stored, and the batch ended
    failure: BaseException | None = None  # it could not be sent, or no stream takes it
    errors: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # a refused message's

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.failure = exc
            self.done.set_result(None)

    def on_reply(self, reply: dict[str, Any], seq: int) -> None:
        """One reply, sent to the reply subject of message `seq`."""
        kind = reply.get("type")
        if kind == "ack":
            self.flowed = max(self.flowed, int(reply.get("seq", 0)))
        elif kind == "err":
            self.errors[int(reply.get("seq", 0))] = dict(reply.get("error") or {})
        elif kind is None and "error" in reply:
            # Message `seq` was refused before it joined the batch (too large, limits, the flag
            # off), or the batch is gone (its first message refused: each later one is then
            # "unknown batch"). The batch goes on without it; in gap mode "fail" the next
            # message ends it, and its PubAck says how many were stored.
            self.errors[seq] = dict(reply["error"])
            if len(self.errors) >= self.size:
                self.done.set_result(None)
        elif kind is None and reply.get("batch") == self.id:
            self.count = int(reply.get("count", 0))
            self.done.set_result(None)
        # "gap" is informational: in gap mode "fail" a gap ends the batch, and its PubAck says so.
        # Anything else (a plain PubAck from a server that does not know fast ingest) proves
        # nothing about the batch: its messages time out and are retried, deduplicated.

    @property
    def disabled(self) -> bool:
        return any(e.get("err_code") == ERR_BATCH_DISABLED for e in self.errors.values())

    def result(self, seq: int) -> BaseException | None:
        """Message `seq`'s outcome: None (stored, or a duplicate skipped), its error, or AGAIN."""
        stored = self.count if self.count is not None else self.flowed
        if seq <= stored:
            return None
        if (error := self.errors.get(seq)) is not None:
            return AGAIN if error.get("err_code") in ERR_BATCH_ONLY else api_error(error)
        if self.failure is not None:
            return self.failure
        if not self.done.done() or self.done.cancelled():
            return TimeoutError("no PubAck before the publish timeout")
        return AGAIN


class FastBatches:
    """A connection's fast batches in flight, and the wire protocol they speak.

    The batch information travels in each message's reply subject,
    `<inbox>.<batch id>.<flow>.fail.<sequence>.<operation>.$FI` (0 start, 1 append, 2 commit),
    so a stored message carries only its own headers. The server stores each message as it comes
    and skips a duplicate Nats-Msg-Id instead of refusing the batch (silently: its PubAck counts
    it as stored). Gap mode "fail": the first message the stream refuses (its error comes as
    `{"type":"err","seq":N}`) ends the batch, and the PubAck of the commit says how many were
    stored: `count`. Flow acks (`{"type":"ack","seq":N}`: 1..N stored) tell what a batch cut
    short by a timeout kept. Each reply comes to the reply subject of the message it concerns.
    """

    def __init__(self) -> None:
        self.prefix = ""
        self.batches: dict[str, FastBatch] = {}

    async def start(self, nc: NATS) -> None:
        """Subscribe to the replies on `nc`, a new connection."""
        self.prefix = f"{nc.new_inbox()}."
        await nc.subscribe(f"{self.prefix}>", cb=self.on_reply)

    async def send(self, nc: NATS, chunk: Sequence[tuple[str, bytes, dict[str, str]]]) -> FastBatch:
        """Send one fast batch of (subject, payload, headers); its state, which the replies fill in."""
        batch = FastBatch(uuid.uuid4().hex, len(chunk), asyncio.get_running_loop().create_future())
        self.batches[batch.id] = batch
        head = f"{self.prefix}{batch.id}.{FAST_FLOW}.fail."
        last = len(chunk)
        messages: list[Message] = [
            (subject, payload, f"{head}{seq}.{2 if seq == last else 0 if seq == 1 else 1}.$FI", headers)
            for seq, (subject, payload, headers) in enumerate(chunk, start=1)
        ]
        try:
            await publish_all(nc, messages)
        except Exception as exc:  # not connected and the outbound buffer full...: the server drops the rest
            batch.fail(exc)
        return batch

    def forget(self, batches: Iterable[FastBatch]) -> None:
        """Done with these: their late replies are dropped."""
        for b in batches:
            self.batches.pop(b.id, None)
            b.done.cancel()

    async def on_reply(self, msg: Msg) -> None:
        tokens = msg.subject[len(self.prefix) :].split(".")
        batch = self.batches.get(tokens[0])
        if batch is None or batch.done.done():
            return
        if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
            batch.fail(NoStreamResponseError())  # no stream takes the subject
            return
        try:
            reply = json.loads(msg.data)
            seq = int(tokens[3])
        except (ValueError, IndexError):
            return
        if isinstance(reply, dict):
            batch.on_reply(reply, seq)
