"""Where a `get` is answered (only on an inbox its requester may listen on), and in what order:
each tenant's gets in a bounded line of their own, the lines served in turn a batch at a time."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from prometheus_client import REGISTRY

from worker.core.readmodel import BATCH, LINE_BYTES, LINE_GETS, ReadModel, answerable
from worker.core.timers import StoredTimer
from worker.errors import TransientError


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


class _Get:
    """A get of `tenant`'s `id` (worker.core.received.Request); its answer goes to `answers`."""

    def __init__(self, answers: list[tuple[str, dict[str, Any]]], tenant: str, id: str, pad: int = 0) -> None:
        self.subject, self.reply, self.answers = f"svc.{tenant}.timer.get", "_INBOX.r", answers
        self.data = json.dumps({"serviceCallId": id, "pad": "x" * pad}).encode()

    async def respond(self, data: bytes) -> None:
        answer = json.loads(data)
        self.answers.append((answer.get("tenantId", "?"), answer))


class _Store:
    """No timer at all; the batches looked up, and a failure for those holding `breaks`."""

    def __init__(self, breaks: str = "", error: Exception | None = None) -> None:
        self.batches: list[tuple[str, list[str]]] = []
        self.breaks, self.error = breaks, error

    async def get_many(self, tenant_id: str, service_call_ids: Sequence[str]) -> dict[str, StoredTimer]:
        self.batches.append((tenant_id, list(service_call_ids)))
        if self.error is not None:
            raise self.error
        if self.breaks in service_call_ids:
            raise ValueError("a value no lookup takes")
        return {}


def _shed() -> float:
    return REGISTRY.get_sample_value("timer_get_requests_shed_total") or 0.0


async def test_each_tenants_gets_are_served_in_turn_a_batch_at_a_time() -> None:
    answers: list[tuple[str, dict[str, Any]]] = []
    store = _Store()
    model = ReadModel(store, "svc")
    for i in range(3 * BATCH):
        await model.receive(_Get(answers, "acme", f"a{i}"))
    await model.receive(_Get(answers, "zeta", "z"))
    await model.drain()
    whose = [tenant for tenant, _ in answers]
    assert whose == ["acme"] * BATCH + ["zeta"] + ["acme"] * 2 * BATCH
    assert [a["serviceCallId"] for t, a in answers if t == "acme"] == [f"a{i}" for i in range(3 * BATCH)]
    batches = [(t, len(ids)) for t, ids in store.batches]
    assert batches == [("acme", BATCH), ("zeta", 1), ("acme", BATCH), ("acme", BATCH)]


async def test_a_tenants_line_past_its_bound_loses_its_oldest_gets() -> None:
    answers: list[tuple[str, dict[str, Any]]] = []
    model, before = ReadModel(_Store(), "svc"), _shed()
    for i in range(LINE_GETS + 10):
        await model.receive(_Get(answers, "acme", f"a{i}"))
    await model.drain()
    assert [a["serviceCallId"] for _, a in answers] == [f"a{i}" for i in range(10, LINE_GETS + 10)]
    assert _shed() - before == 10


async def test_a_tenants_line_holds_a_bounded_number_of_bytes() -> None:
    answers: list[tuple[str, dict[str, Any]]] = []
    model, before = ReadModel(_Store(), "svc"), _shed()
    for i in range(5):  # a third of the bound each: three fit
        await model.receive(_Get(answers, "acme", f"a{i}", pad=LINE_BYTES // 3 - 50))
    await model.drain()
    assert [a["serviceCallId"] for _, a in answers] == ["a2", "a3", "a4"]
    assert _shed() - before == 2


async def test_a_get_whose_values_break_a_batch_fails_alone() -> None:
    answers: list[tuple[str, dict[str, Any]]] = []
    store = _Store(breaks="bad")
    model = ReadModel(store, "svc")
    for id in ("a", "bad", "c"):
        await model.receive(_Get(answers, "acme", id))
    await model.drain()
    assert [a["error"] for _, a in answers] == ["not_found", "bad_request", "not_found"]
    assert store.batches == [("acme", ["a", "bad", "c"]), ("acme", ["a"]), ("acme", ["bad"]), ("acme", ["c"])]


async def test_a_store_away_answers_a_whole_batch_unavailable_in_one_lookup() -> None:
    answers: list[tuple[str, dict[str, Any]]] = []
    store = _Store(error=TransientError("connection refused"))
    model = ReadModel(store, "svc")
    for id in ("a", "b"):
        await model.receive(_Get(answers, "acme", id))
    await model.receive(_Get(answers, "acme", ""))  # answered bad_request, not looked up
    await model.drain()
    assert [a["error"] for _, a in answers] == ["unavailable", "unavailable", "bad_request"]
    assert store.batches == [("acme", ["a", "b"])]
