"""nats.connect()'s options for the settings, for a replica and the operator's tools."""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.config import Settings


def _tls_context(s: Settings) -> ssl.SSLContext | None:
    if not (s.nats_tls_ca or s.nats_tls_cert or s.nats_url.startswith("tls://")):
        return None
    ctx = ssl.create_default_context(cafile=s.nats_tls_ca)
    if s.nats_tls_cert and s.nats_tls_key:
        ctx.load_cert_chain(s.nats_tls_cert, s.nats_tls_key)
    return ctx


def connect_options(s: Settings) -> dict[str, Any]:
    """nats.connect() keyword arguments for these settings (credentials, TLS, reconnects)."""
    opts: dict[str, Any] = {
        "servers": [u.strip() for u in s.nats_url.split(",")],
        "name": s.worker_id,
        "max_reconnect_attempts": -1,  # a replica waits out a NATS outage; readiness says so
        "reconnect_time_wait": 0.5,
        "connect_timeout": 5,
        "allow_reconnect": True,
        # What nats-py holds while reconnecting; past it a publish fails at once (it is retried).
        "pending_size": s.publish_buffer_bytes,
    }
    if s.nats_user:
        opts["user"] = s.nats_user
    if s.nats_password:
        opts["password"] = s.nats_password.get_secret_value()
    if s.nats_token:
        opts["token"] = s.nats_token.get_secret_value()
    if s.nats_nkey_seed:
        opts["nkeys_seed_str"] = s.nats_nkey_seed.get_secret_value()
    if s.nats_creds:
        opts["user_credentials"] = s.nats_creds
    if ctx := _tls_context(s):
        opts["tls"] = ctx
        if s.nats_tls_server_name:
            opts["tls_hostname"] = s.nats_tls_server_name
    return opts
