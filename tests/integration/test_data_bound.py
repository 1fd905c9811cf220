"""`data`'s bound bounds the event (docs/CONTRACT.md, Data; docs/OPERATIONS.md, Sizing): what a
DueTimeReached carries is `data` as Postgres jsonb prints it, numbers in plain notation at their full
scale, so intake measures that, against real Postgres here; and a row whose event the server would
refuse for its size all the same (stored before, or by hand) is set aside with back-off, never
retried every second; and a `get` reply carries `data` no larger than the events do.

The property test's seed is fixed (derandomize) with modest examples in `make test`;
TIMER_CHAOS_SCALE (set by `make chaos-soak`) multiplies them, as in test_fuzz.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from psycopg.types.json import Jsonb

from tests.helpers import jetstream, property_settings, query
from tests.twins import claim_params
from worker.adapters.postgres import db
from worker.adapters.postgres.store import Store
from worker.config import Settings
from worker.contract import (
    MAX_BODY_BYTES,
    CancelTimer,
    MessageIds,
    Rejection,
    ScheduleTimer,
    due_event,
    iso,
    wire_size,
)
from worker.core.commands import parse_command
from worker.core.eventsize import largest_event
from worker.core.readmodel import ReadModel
from worker.service import Replica

FUZZ = property_settings(60)
MEASURED = re.compile(r"data is (\d+) bytes as its events carry it, more than 0")
IDS = MessageIds(b"a fleet secret of thirty-two b..")

# JSON text as a hostile producer writes it: numbers with huge and tiny exponents (1E+999999 is no
# finite number: refused), long digit strings, -0, strings with escapes and any Unicode, nesting.
numbers = st.one_of(
    st.sampled_from(
        [
            "5e-324",
            "4.9E-324",
            "1e308",
            "1.7976931348623157e308",
            "2.2250738585072014e-308",
            "1E+999999",
            "-1e-999999",
            "-0.0",
            "-0e0",
            "1e16",
            "9999999999999998.0",
            "1e-5",
            "0.0001",
            "0.00009999999999999999",
            "0.1",
            "123456789.123456789e-300",
        ]
    ),
    st.builds(
        lambda m, f, e: f"{m}.{f}e{e}",
        st.integers(-(10**20), 10**20),
        st.integers(0, 10**30),
        st.integers(-400, 400),
    ),
    st.from_regex(r"-?[1-9][0-9]{0,400}(\.[0-9]{1,400})?([eE][+-]?[0-9]{1,3})?", fullmatch=True),
)
strings = st.builds(
    lambda text, ascii_only: json.dumps(text, ensure_ascii=ascii_only),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=40),
    st.booleans(),
)
scalars = numbers | strings | st.sampled_from(["true", "false", "null", '"\\u00e9\\n\\t\\"\\\\\\/"'])
json_texts = st.one_of(
    st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=40).map(lambda xs: "[" + ",".join(xs) + "]")
            | st.lists(st.tuples(strings, inner), max_size=20).map(
                lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"
            )
        ),
        max_leaves=300,
    ),
    st.builds(lambda n, k: "[" + ",".join([n] * k) + "]", numbers, st.integers(1, 3000)),  # one number, many
    st.builds(lambda d, x: "[" * d + x + "]" * d, st.integers(1, 900), scalars),  # deep
)
limits = st.sampled_from([0, 1, 300, 16 * 1024, MAX_BODY_BYTES]) | st.integers(0, MAX_BODY_BYTES)


def _body(key: str, data: str) -> bytes:
    return (
        f'{{"tenantId":"acme","serviceCallId":"{key}","dueAt":"2020-01-01T00:00:00Z","data":{data}}}'.encode()
    )


def _parse(body: bytes, limit: int) -> ScheduleTimer | Rejection:
    parsed = parse_command(
        "schedule",
        "acme",
        body,
        now=datetime.now(UTC),
        max_horizon=timedelta(days=3650),
        max_payload_bytes=limit,
    )
    assert not isinstance(parsed, CancelTimer)
    return parsed


def _negative_zeros(value: Any) -> int:
    """How many -0.0 `value` holds: jsonb's numeric prints each as 0.0, a byte less than measured."""
    stack, count = [value], 0
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif type(item) is float and item == 0 and str(item).startswith("-"):
            count += 1
    return count


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    async with db.pool(db_url, "data-bound", min_size=1, max_size=2, idle_in_transaction_ms=60_000) as pool:
        yield Store(pool)


async def test_no_accepted_data_makes_an_event_over_its_bound(store: Store, db_url: str) -> None:
    """Each example: hostile `data` text. Its measure is what Postgres prints for it (exactly, but
    for -0.0), and once accepted under a bound, stored by intake's own write and claimed as the
    firing loop claims it, its event's `data` is within the bound and the event within
    largest_event, whatever the numbers, nesting and escapes."""
    loop = asyncio.get_running_loop()
    keys = (f"k{i}" for i in itertools.count())

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)

    @FUZZ
    @given(data=json_texts, limit=limits)
    def one(data: str, limit: int) -> None:
        key = next(keys)
        body = _body(key, data)
        largest = _parse(body, 2**62)  # no bound: its value, however large as stored
        if not isinstance(largest, ScheduleTimer):
            return  # not JSON, not finite, too deep, the body too large: nothing stored
        measure = _parse(body, 0)
        assert isinstance(measure, Rejection) and (m := MEASURED.fullmatch(measure.detail)), measure
        printed = query(db_url, "SELECT %s::jsonb::text", Jsonb(largest.data))[0][0]
        actual = len(printed.encode())
        assert actual <= int(m[1]) <= actual + _negative_zeros(largest.data), (printed[:200], m[1])
        accepted = _parse(body, limit)
        assert isinstance(accepted, ScheduleTimer) == (int(m[1]) <= limit), (accepted, limit)
        if not isinstance(accepted, ScheduleTimer):
            return
        run(store.apply([accepted]))
        batch = run(store.claim(claim_params("fuzz", 10, lease_ms=60_000)))
        try:
            (claimed,) = [c for c in batch.result.claimed if c.service_call_id == key]
        finally:
            run(batch.close())
        assert claimed.data is not None and len(claimed.data.encode()) <= limit
        event = due_event(claimed, "svc.acme.timer.due", iso(datetime.now(UTC)), 0, IDS)
        assert wire_size(event) <= largest_event(limit, set())

    await asyncio.to_thread(one)


def _fire_errors() -> float:
    return REGISTRY.get_sample_value("timer_fire_errors_total", {"reason": "event_too_large"}) or 0.0


# A row stored before intake measured `data` as delivered, or written by hand: its event over the
# server's max_payload (1 MiB) by its payload (nats-py refuses it), or by its headers alone (the
# server would close the connection: nats-py checks the payload alone).
OVERSIZED = {
    "payload": ("('[' || repeat('5e-324,', 3300) || '0]')::jsonb", None),
    "headers": (
        "to_jsonb(repeat('x', 1048576 - 400))",
        json.dumps({"x-a": "v" * 512, "x-b": "w" * 512}),
    ),
}


@pytest.mark.parametrize("case", OVERSIZED)
async def test_a_row_whose_event_is_too_large_is_set_aside_with_back_off(
    settings: Settings, case: str
) -> None:
    data_sql, carried = OVERSIZED[case]
    url = settings.database_url.get_secret_value()
    replica = Replica(settings.model_copy(update={"carry_headers": "x-a,x-b"}))
    assert await replica.connect()
    try:
        limit = replica.broker.max_payload
        query(
            url,
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, attempts, carried_headers, data)"
            f" VALUES ('acme', 'big', 'Scheduled', now() - interval '1 s', 6, %s::jsonb, {data_sql})",
            carried,
        )
        before = _fire_errors()
        await replica.firing.tick()
        state, attempts, error, backoff = query(
            url,
            "SELECT state, attempts, last_error, extract(epoch FROM lease_expires_at - now()) FROM timers",
        )[0]
        # Recorded on the row (`get` shows attempts and lastError), counted, and backed off as a
        # broken row (1 s doubling per attempt: 64 s at its 7th), not in a second as a failed publish.
        assert state == "Scheduled" and attempts == 7
        size = re.fullmatch(
            rf"its event is (\d+) bytes, more than the NATS server's max_payload {limit}", error
        )
        assert size is not None and int(size[1]) > limit, error
        assert backoff > 60, backoff
        assert _fire_errors() == before + 1
        assert replica.broker.nc is not None and replica.broker.nc.stats["reconnects"] == 0
        async with jetstream(settings) as js:
            assert (await js.stream_info(settings.event_stream)).state.messages == 0
    finally:
        await replica.broker.close()
        await replica.pool.close()


class _Get:
    """A `get` request (worker.core.received.Request), keeping its reply."""

    def __init__(self, service_call_id: str) -> None:
        self.subject, self.reply = "svc.acme.timer.get", "_INBOX.r"
        self.data = json.dumps({"serviceCallId": service_call_id}).encode()
        self.answer = b""

    async def respond(self, data: bytes) -> None:
        self.answer = data


async def test_a_get_reply_carries_data_no_larger_than_its_events_do(store: Store) -> None:
    # ASCII escapes made each 2-byte character of `data` 6 bytes in the reply: three times what its
    # events carry, so a reply could outgrow a max_payload every event of the timer fits.
    data = "\u00e9" * 20_000
    limit = len(json.dumps(data, ensure_ascii=False).encode())  # 40,002: its events carry that
    accepted = _parse(_body("wide", json.dumps(data, ensure_ascii=False)), limit)
    assert isinstance(accepted, ScheduleTimer)
    await store.apply([accepted])
    request = _Get("wide")
    readmodel = ReadModel(store, "svc")
    await readmodel.receive(request)
    await readmodel.drain()
    assert json.loads(request.answer)["data"] == data
    assert len(request.answer) < limit + 1000
