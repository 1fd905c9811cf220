"""Where a `get` is answered: only on an inbox its requester may listen on."""

from __future__ import annotations

import pytest

from worker.core.readmodel import answerable


@pytest.mark.parametrize(
    ("tenant", "reply"),
    [
        ("acme", "_INBOX.abc.1"),  # nats-py's and nats.go's default inbox
        ("acme", "_INBOX_acme.abc.1"),  # the tenant's own, as docs/SECURITY.md has it connect
        ("acme", "_R_.aB3xYz.q1"),  # a service import's reply, an account per tenant
        (None, "_INBOX.abc"),  # a bad subject's bad_request still reaches a plain inbox
    ],
)
def test_an_inbox_is_answered(tenant: str | None, reply: str) -> None:
    assert answerable(tenant, reply)


@pytest.mark.parametrize(
    ("tenant", "reply"),
    [
        ("acme", "svc.zeta.timer.due"),  # another tenant's events
        ("acme", "svc.zeta.timer.schedule"),
        ("acme", "svc._timer.wake"),
        ("acme", "$JS.API.STREAM.PURGE.TIMER_EVENTS"),
        ("acme", "_INBOX_zeta.TIMER_EVENTS"),  # another tenant's events consumer
        ("acme", "_INBOX_acme2.x"),  # a tenant whose name starts with acme's
        ("acme2", "_INBOX_acme.x"),
        (None, "_INBOX_acme.x"),
        ("acme", "_INBOX"),  # no token after the prefix: not a subject an inbox gives
        ("acme", "_INBOX."),
        ("acme", "orders.created"),  # another application's subject on the same server
    ],
)
def test_anything_else_is_not(tenant: str | None, reply: str) -> None:
    assert not answerable(tenant, reply)
