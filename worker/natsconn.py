"""A NATS connection that never goes out in clear when TLS is configured: for the service and the
producer client alike (so this module needs nothing but nats-py)."""

from __future__ import annotations

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
