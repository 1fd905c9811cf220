"""The own NATS wire: every nats-py internal this package relies on, and nowhere else.

nats-py's public API costs too much per message for a timer service (a Msg, parsed headers and a
queued task per delivery; a regular expression per header key per publish) and upgrades to TLS
only when the server asks. What goes around it here: the TLS-enforcing client (`_process_info`),
the raw delivery hook (`_process_msg`, a subscription's `_id` and `_pending_queue`), one write for
many publishes (`_send_publish`, `_send_command`, `_flush_pending`, `_flush_queue`, `_pending`,
`_max_payload`, `_skip_subject_validation`, `_flusher_task`, `_validate_subject`,
`_HEADER_KEY_RE`, `_SUBJECT_INVALID_RE`) and a JetStream context's connection (`_nc`).
tests/unit/client/test_wire_internals.py has one test per name, failing when the installed nats-py drops or
reshapes it; pyproject.toml states the nats-py versions that are tested (the floor by
tests/integration/test_installed.py, the newest by the rest of the suite). Every use but the TLS
check falls back to the public API when a name is missing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import nats.aio.client
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext


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


def connection_of(js: JetStreamContext) -> NATS:
    """The connection a JetStream context sends on (nats-py keeps it as `_nc`, with no public name)."""
    nc: NATS = js._nc
    return nc


def subscription_id(sub: Any) -> int:
    """A subscription's id on its connection, the `sid` of its MSG lines (take_raw's key)."""
    sid: int = sub._id
    return sid


def queued(sub: Any) -> Any:
    """The oldest message in a subscription's own queue (nats-py's Msg), taken; None when it is
    empty, or for a nats-py that keeps no such queue."""
    queue: asyncio.Queue[Any] | None = getattr(sub, "_pending_queue", None)
    return None if queue is None or queue.empty() else queue.get_nowait()


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
# nats-py would, message by message, byte for byte (tests/unit/client/test_wire.py, and
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
