"""A NATS connection that never goes out in clear when TLS is configured: for the service and the
producer client alike (so this module needs nothing but nats-py)."""

from __future__ import annotations

import json
from typing import Any

import nats.errors
from nats.aio.client import Client as NATS


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
