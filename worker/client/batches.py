"""JetStream batch publish (ADR-50), atomic and fast-ingest: what each sends, what replies say."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NoStreamResponseError

from worker.client.envelopes import Envelope
from worker.client.wire import Message, publish_all
from worker.contract import FAST_BATCHES

# Atomic batches (nats-server 2.12+): only the commit gets a reply, the batch's PubAck.
ATOMIC_BATCH_MAX = 1000  # JetStream's limit on messages in one atomic batch
ERR_ATOMIC_DISABLED = 10174  # the stream has no allow_atomic


def atomic_batch_headers(
    headers: dict[str, str] | None, batch_id: str, seq: int, commit: bool
) -> dict[str, str]:
    out = {**(headers or {}), "Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(seq)}
    if commit:
        out["Nats-Batch-Commit"] = "1"
    return out


def atomic_batch_head(
    chunk: Sequence[tuple[str, bytes, dict[str, str] | None]], batch_id: str
) -> list[Message]:
    """Every message of atomic batch `batch_id` but its commit, the last of `chunk`."""
    return [
        (subject, payload, "", atomic_batch_headers(headers, batch_id, seq, commit=False))
        for seq, (subject, payload, headers) in enumerate(chunk[:-1], start=1)
    ]


async def send_atomic(
    nc: NATS, chunk: Sequence[tuple[str, bytes, dict[str, str] | None]], timeout: float
) -> dict[str, Any] | None:
    """Send `chunk` as one atomic batch: None once its PubAck confirms every message, else why not."""
    batch_id = uuid.uuid4().hex
    try:
        await publish_all(nc, atomic_batch_head(chunk, batch_id))
        subject, payload, headers = chunk[-1]
        commit = atomic_batch_headers(headers, batch_id, len(chunk), commit=True)
        reply = await nc.request(subject, payload, timeout=timeout, headers=commit)
    except Exception as exc:  # the caller sends them one by one
        return {"description": f"{type(exc).__name__}: {exc}"}
    return batch_ack_error(reply.data, len(chunk))


def batch_ack_error(reply: bytes, size: int) -> dict[str, Any] | None:
    """None when a batch's PubAck confirms all `size` messages, else its error."""
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


# Fast-ingest batches (allow_batched streams).
FAST_INGEST_SINCE = (2, 14)
# An older nats-py has no allow_batched: everything goes in atomic batches.
CLIENT_KNOWS_BATCHED = "allow_batched" in {f.name for f in dataclasses.fields(api.StreamConfig)}
ERR_BATCH_DISABLED = 10205  # the stream has no allow_batched (any more)
# Errors against the batch, not the message: such a message goes again one by one.
ERR_BATCH_ONLY = {ERR_BATCH_DISABLED, 10206, 10207, 10208, 10211}
# Stored messages per flow ack, at most (the server's ceiling): what a timed-out batch keeps.
FAST_FLOW = 500


def server_has_fast_ingest(nc: NATS | None) -> bool:
    """Whether `nc`'s server, and this nats-py, know fast-ingest batches."""
    if not CLIENT_KNOWS_BATCHED or nc is None or not nc.is_connected:
        return False
    try:
        version = nc.connected_server_version
        return (version.major, version.minor) >= FAST_INGEST_SINCE
    except (TypeError, ValueError, AttributeError):  # no version in the server's INFO
        return False


def api_error(error: dict[str, Any]) -> APIError:
    """The error a PubAck carries, returned (nats-py's from_error raises it)."""
    try:
        APIError.from_error(error)
    except APIError as exc:
        return exc
    return APIError(description=str(error))  # pragma: no cover  # from_error always raises


# A message of a fast batch not stored though not refused itself: sent again.
AGAIN = Exception("send again")


@dataclasses.dataclass
class FastBatch:
    """What the server said so far of one fast batch."""

    id: str
    size: int
    done: asyncio.Future[None]
    flowed: int = 0  # the highest flow ack: messages 1..flowed are stored
    count: int | None = None  # the PubAck's: messages 1..count are stored, and the batch ended
    failure: BaseException | None = None  # not sent, or no stream takes it
    errors: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)  # by message

    def fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.failure = exc
            self.done.set_result(None)

    def on_reply(self, reply: dict[str, Any], seq: int) -> None:
        kind = reply.get("type")
        if kind == "ack":
            self.flowed = max(self.flowed, int(reply.get("seq", 0)))
        elif kind == "err":
            self.errors[int(reply.get("seq", 0))] = dict(reply.get("error") or {})
        elif kind is None and "error" in reply:
            # Refused before joining the batch, or the batch is gone: in gap mode "fail" the
            # next message ends it, and its PubAck says how many were stored.
            self.errors[seq] = dict(reply["error"])
            if len(self.errors) >= self.size:
                self.done.set_result(None)
        elif kind is None and reply.get("batch") == self.id:
            self.count = int(reply.get("count", 0))
            self.done.set_result(None)
        # Anything else ("gap", a plain PubAck) proves nothing: its messages time out, retried.

    @property
    def disabled(self) -> bool:
        return any(e.get("err_code") == ERR_BATCH_DISABLED for e in self.errors.values())

    def result(self, seq: int) -> BaseException | None:
        """Message `seq`'s outcome: None (stored or a duplicate), its error, or AGAIN."""
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


@dataclasses.dataclass(frozen=True)
class Sent:
    """What became of one command of schedule_many or cancel_many."""

    id: str  # the envelope id, also its Nats-Msg-Id
    outcome: Literal["accepted", "duplicate", "error"]
    error: str | None = None


class FastBatches:
    """A connection's fast batches in flight, each message's batch in its reply subject
    (`<inbox>.<batch id>.<flow>.fail.<sequence>.<operation>.$FI`)."""

    def __init__(self) -> None:
        self.prefix = ""
        self.batches: dict[str, FastBatch] = {}

    async def start(self, nc: NATS) -> None:
        self.prefix = f"{nc.new_inbox()}."
        await nc.subscribe(f"{self.prefix}>", cb=self.on_reply)

    async def send_part(
        self,
        nc: NATS,
        part: list[tuple[int, Envelope]],
        results: list[Sent | None],
        timeout: float,
        headers: Mapping[str, str],
    ) -> tuple[list[tuple[int, Envelope]], bool]:
        """Send `part` as one fast batch, filling in `results`; what is left to send one by one,
        and whether allow_batched is gone."""
        batch = await self.send(nc, [(c.subject, c.body, {**headers, "Nats-Msg-Id": c.id}) for _, c in part])
        try:
            await asyncio.wait([batch.done], timeout=timeout)
        finally:
            self.forget([batch])
        again: list[tuple[int, Envelope]] = []
        for seq, (i, c) in enumerate(part, start=1):
            result = batch.result(seq)
            if result is None:  # fresh ids: no duplicates
                results[i] = Sent(c.id, "accepted")
            elif isinstance(result, APIError):
                results[i] = Sent(c.id, "error", f"{type(result).__name__}: {result}")
            else:
                again.append((i, c))
        return again, batch.disabled

    async def send(self, nc: NATS, chunk: Sequence[tuple[str, bytes, dict[str, str]]]) -> FastBatch:
        """Send one fast batch; its state, which the replies fill in."""
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
        except Exception as exc:  # e.g. the reconnect buffer full: the server drops the rest
            batch.fail(exc)
        return batch

    def forget(self, batches: Iterable[FastBatch]) -> None:
        """Drop these batches' late replies."""
        for b in batches:
            self.batches.pop(b.id, None)
            b.done.cancel()

    async def on_reply(self, msg: Msg) -> None:
        tokens = msg.subject[len(self.prefix) :].split(".")
        batch = self.batches.get(tokens[0])
        if batch is None or batch.done.done():
            return
        if msg.headers and msg.headers.get(api.Header.STATUS) == "503":
            batch.fail(NoStreamResponseError())
            return
        try:
            reply = json.loads(msg.data)
            seq = int(tokens[3])
        except (ValueError, IndexError):
            return
        if isinstance(reply, dict):
            batch.on_reply(reply, seq)


async def service_measured_fast(js: JetStreamContext, probe_subject: str) -> bool:
    """Whether the service's probe stream says fast batches are the cheaper on this server."""
    try:
        name = await js.find_stream_name_by_subject(probe_subject)
        config = (await js.stream_info(name)).config
    except Exception:  # no stream, no permission: not measured
        return False
    return (config.metadata or {}).get(FAST_BATCHES) == "on"
