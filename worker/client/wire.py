"""Every nats-py internal this package relies on: the public API costs too much per message and
upgrades to TLS only when asked. Each name is tested (test_wire_internals.py); all but the TLS
check fall back to the public API."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import nats.aio.client
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext


class _TlsEnforcingClient(NATS):
    """With TLS configured, refuses a server whose INFO does not require TLS, rather than send
    CONNECT (credentials included) in clear."""

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
    nc: NATS = js._nc
    return nc


def subscription_id(sub: Any) -> int:
    sid: int = sub._id
    return sid


def queued(sub: Any) -> Any:
    """Take the oldest message of a subscription's queue; None when there is none."""
    queue: asyncio.Queue[Any] | None = getattr(sub, "_pending_queue", None)
    return None if queue is None or queue.empty() else queue.get_nowait()


# subject, reply, payload, header block (with its `NATS/1.0` line) or None
RawHandler = Callable[[bytes, bytes, bytes, "bytes | None"], None]


def take_raw(nc: NATS, sid: int, handler: RawHandler) -> Callable[[], None] | None:
    """Hand subscription `sid`'s messages to `handler` as read, before nats-py makes a Msg; the
    undo, or None if this nats-py cannot be hooked. `handler` must not block."""
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
        nc.__dict__["_process_msg"] = routed
    handlers[sid] = handler

    def release() -> None:
        handlers.pop(sid, None)

    return release


# What publish_all needs of nats-py's internals:
_CLIENT_NEEDS = ("_send_publish", "_send_command", "_flush_pending")
_INSTANCE_NEEDS = ("_flush_queue", "_max_payload", "_skip_subject_validation", "stats", "_flusher_task")
_MODULE_NEEDS = ("_validate_subject", "_HEADER_KEY_RE")
_CRLF = b"\r\n"
_NEWLINES = str.maketrans({"\r": " ", "\n": " "})  # as nats-py: a value never ends its line
# A header key's `Key: ` once checked (None: blank, skipped); bounded, as keys come from users.
_KEYS: dict[str, str | None] = {}
_KEYS_MAX = 256
# When nats-py's invalid subject characters are this whitespace, a scan replaces its regex.
_INVALID = getattr(nats.aio.client, "_SUBJECT_INVALID_RE", None)
_SUBJECT_WHITESPACE = " \t\r\n" if _INVALID is not None and _INVALID.pattern == r"[ \t\r\n]" else None
_wire_ok: bool | None = None  # _wire_matches' verdict

Message = tuple[str, bytes, str, "dict[str, str] | None"]  # subject, payload, reply, headers


class _Slow(Exception):
    """What nats-py refuses or handles one at a time: the batch goes through `publish`."""


def _key(k: str) -> str | None:
    if (known := _KEYS.get(k, "")) != "":
        return known
    key = k.strip()
    if not key:
        encoded = None
    elif nats.aio.client._HEADER_KEY_RE.fullmatch(key):
        encoded = key + ": "
    else:
        raise _Slow  # nats-py raises BadHeaderError at the same message
    if len(_KEYS) < _KEYS_MAX:
        _KEYS[k] = encoded
    return encoded


def encode(messages: Sequence[Message], max_payload: int = 1 << 62) -> tuple[bytes, int]:
    """The PUB/HPUB commands nats-py makes of these messages, joined, and their payload size;
    _Slow for what nats-py refuses."""
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
            # Built as text, encoded once; its length in UTF-8 is the text's when ASCII.
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
    return (
        all(hasattr(NATS, a) for a in _CLIENT_NEEDS)
        and all(hasattr(nc, a) for a in _INSTANCE_NEEDS)
        and all(hasattr(nats.aio.client, a) for a in _MODULE_NEEDS)
    )


async def _wire_matches() -> bool:
    """Whether `encode` still makes what this nats-py's `_send_publish` makes, checked once."""
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
        except Exception:
            _wire_ok = False
    return _wire_ok


async def publish_all(nc: NATS, messages: Sequence[Message]) -> None:
    """`nc.publish` of each message, same bytes, errors and stats, in one write; `publish` itself
    when not connected, for a refused message, or a nats-py this does not fit."""
    try:
        if not (_fits(nc) and await _wire_matches()) or not nc.is_connected or nc.is_draining_pubs:
            raise _Slow
        if not nc._skip_subject_validation:
            validate = nats.aio.client._validate_subject
            for subject in {m[0] for m in messages}:  # few: one per tenant
                validate(subject)
            # Replies differ per message: checked joined, as publish checks only whitespace.
            if (replies := "".join([m[2] for m in messages])) and (
                _SUBJECT_WHITESPACE is None or any(c in replies for c in _SUBJECT_WHITESPACE)
            ):
                validate(replies)
        command, size = encode(messages, nc._max_payload)
    # What nats-py refuses: its own publish raises it at the same message.
    except (_Slow, nats.errors.Error, AttributeError, TypeError, ValueError):
        for subject, payload, reply, headers in messages:
            await nc.publish(subject, payload, reply=reply, headers=headers)
        return
    if messages:
        await _write(nc, command, len(messages), size)


async def acknowledge(nc: NATS, replies: Sequence[bytes], body: bytes = b"") -> None:
    """`nc.publish(reply.decode(), body)` for each reply subject, in one write. The server's own
    subjects need no check."""
    if not replies:
        return
    if not (_fits(nc) and await _wire_matches()) or not nc.is_connected or nc.is_draining_pubs:
        for reply in replies:
            await nc.publish(reply.decode(), body)
        return
    rest = b"  %d\r\n%s\r\n" % (len(body), body)  # no reply: two spaces, as nats-py
    command = b"".join([b"PUB " + reply + rest for reply in replies])
    await _write(nc, command, len(replies), len(body) * len(replies))


async def _write(nc: NATS, command: bytes, count: int, size: int) -> None:
    """Queue encoded PUBs as nats-py's publish does."""
    nc.stats["out_msgs"] += count
    nc.stats["out_bytes"] += size
    await nc._send_command(command)
    if nc._flush_queue is not None and nc._flush_queue.empty():
        await nc._flush_pending()


async def written(nc: NATS, wait: float = 1.0) -> None:
    """Wait, at most `wait` seconds, until what was published is handed to the socket: nats-py's
    flusher writes only at the publisher's next wait. A hint, not a guarantee."""
    flusher = getattr(nc, "_flusher_task", None)
    if not (_fits(nc) and nc.is_connected) or nc._flush_queue is None or flusher is None or flusher.done():
        return
    # nats-py's own kick: a future answered once everything before it is written.
    done = asyncio.get_running_loop().create_future()
    await nc._flush_queue.put(done)
    await asyncio.wait([done], timeout=wait)
