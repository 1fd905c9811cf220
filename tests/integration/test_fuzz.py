"""Property tests of the error boundary (worker/errors.py, verdict): whatever is written into a
claimed row, and whatever bytes and headers a command carries, no loop ends. A bad row is recorded
on itself (lastError) or fires; a bad command is acknowledged (stored, or copied to the DLQ).

Fixed seed (derandomize) and modest example counts in `make test`; TIMER_CHAOS_SCALE (set by `make
chaos-soak`) multiplies the examples.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from datetime import UTC
from typing import Any, TypeVar

import nats
import psycopg
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import consumer_idle, property_settings, running_replica, until
from worker.config import Settings
from worker.service import Replica

T = TypeVar("T")

FUZZ = property_settings(40)

# Text Postgres (UTF8) can hold: no NUL, no lone surrogates. Anything else goes.
stored_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=80)
timestamps = st.one_of(
    st.sampled_from(
        [
            "-infinity",
            "infinity",
            "4713-01-01 00:00:00+00 BC",
            "0001-01-01 00:00:00+00",
            "1969-12-31 23:59:59.999999+00",
            "1970-01-01 00:00:00+00",
            "9999-12-31 00:00:00.001+00",
            "294276-12-31 00:00:00+00",
        ]
    ),
    st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
    st.integers(-5, 0).map(lambda s: f"now() {s} s"),  # due, a normal row
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | stored_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(stored_text, inner, max_size=4),
    max_leaves=8,
)
rows = st.fixed_dictionaries(
    {
        "service_call_id": stored_text.filter(bool),
        "due_at": timestamps,
        "correlation_id": st.none() | stored_text,
        "repeat_every": st.none()
        | st.sampled_from(["PT1H", "P1M", "PT0S", "-PT1H", "P99999Y", "x"])
        | stored_text,
        "repeat_times": st.none() | st.integers(-(2**31), 2**31 - 1),
        "repeat_timezone": st.none()
        | st.sampled_from(["Europe/Paris", "Nowhere/Zone", "", "UTC"])
        | stored_text,
        "anchor_due_at": st.none() | timestamps,
        "occurrence_index": st.integers(-(2**31), 2**31 - 1),
        "attempts": st.sampled_from([0, 2**31 - 1]) | st.integers(-(2**31), 2**31 - 1),
        "fired_count": st.sampled_from([0, 2**31 - 1]) | st.integers(-(2**31), 2**31 - 1),
        "carried_headers": st.none()
        | json_values
        | st.dictionaries(st.sampled_from(["traceparent", "tracestate", "x-a"]) | stored_text, stored_text),
    }
)


def _insert(db_url: str, row: dict[str, Any]) -> None:
    """The row as someone could write it by hand, Scheduled and claimable."""
    due, anchor = row["due_at"], row["anchor_due_at"]
    due_sql = f"(now() + interval '{due[6:]}')" if due.startswith("now()") else "%s::timestamptz"
    anchor_sql = (
        "NULL"
        if anchor is None
        else f"(now() + interval '{anchor[6:]}')"
        if anchor.startswith("now()")
        else "%s::timestamptz"
    )
    params: list[Any] = [row["service_call_id"]]
    params += [] if due.startswith("now()") else [due]
    params += [] if anchor is None or anchor.startswith("now()") else [anchor]
    carried = row["carried_headers"]
    params += [
        row["correlation_id"],
        row["repeat_every"],
        row["repeat_times"],
        row["repeat_timezone"],
        row["occurrence_index"],
        row["attempts"],
        row["fired_count"],
        None if carried is None else json.dumps(carried),
    ]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DELETE FROM timers")
        conn.execute(
            "INSERT INTO timers (tenant_id, service_call_id, state, due_at, anchor_due_at, correlation_id,"
            " repeat_every, repeat_times, repeat_timezone, occurrence_index, attempts, fired_count,"
            " carried_headers) VALUES ('acme', %s, 'Scheduled',"
            f" {due_sql}, {anchor_sql}, %s, %s, %s, %s, %s, %s, %s, %s::jsonb)",
            params,
        )


def _run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    return loop.run_until_complete(coro)


def test_no_row_value_ends_the_firing_loop(settings: Settings, db_url: str) -> None:
    """Each example: one hand-written row, claimed by a real claim and fired or recorded."""
    loop = asyncio.new_event_loop()
    replica = Replica(settings.model_copy(update={"lease_ms": 1000, "publish_timeout_ms": 500}))
    assert _run(loop, replica.connect())  # what `run` does first: migrate, pool, fleet secret, streams

    @FUZZ
    @given(row=rows)
    def one_row(row: dict[str, Any]) -> None:
        _insert(db_url, row)
        _run(loop, replica.firing.tick())  # raises if the row escaped the boundary
        with psycopg.connect(db_url, autocommit=True) as conn:
            state, attempts, error = conn.execute(
                "SELECT state, attempts, last_error FROM timers"
            ).fetchone() or (
                None,
                0,
                None,
            )
        # Fired, or recorded on itself, or not claimed at all (not due, or infinitely far).
        assert state == "Reached" or error is not None or attempts == row["attempts"], (
            state,
            attempts,
            error,
        )

    try:
        one_row()
    finally:
        _run(loop, replica.broker.close())
        _run(loop, replica.pool.close())
        loop.close()


header_names = st.sampled_from(["traceparent", "tracestate", "x-a", "X-A", "Nats-Msg-Id"]) | st.from_regex(
    r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,20}",
    fullmatch=True,  # what a NATS client sends (RFC 7230 tokens)
)
header_values = st.text(
    st.characters(min_codepoint=32, blacklist_categories=("Cs",), blacklist_characters="\r\n\x7f"),
    max_size=600,
)
bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"tenantId": st.sampled_from(["acme", "other"]) | stored_text, "serviceCallId": stored_text},
        optional={"dueAt": st.sampled_from(["2030-01-01T00:00:00Z", "0001-01-01T00:00:00Z"]) | stored_text},
    ).map(lambda d: json.dumps(d).encode()),
)


def test_no_command_bytes_or_headers_end_intake(settings: Settings) -> None:
    """Each example: one command of random bytes and headers on a command subject; it must be
    acknowledged (stored or sent to the DLQ) and the replica must still run."""
    loop = asyncio.new_event_loop()

    async def fuzz() -> None:
        async with running_replica(settings, carry_headers="x-a") as replica:
            nc = await nats.connect(settings.nats_url)
            js = nc.jetstream()

            @FUZZ
            @given(
                kind=st.sampled_from(["schedule", "cancel"]),
                body=bodies,
                headers=st.dictionaries(header_names, header_values, max_size=4),
            )
            def one_command(kind: str, body: bytes, headers: dict[str, str]) -> None:
                async def send() -> None:
                    headers.pop("Nats-Msg-Id", None)  # a dedupe id of ours would hide the next example
                    await js.publish(
                        f"{settings.subject_prefix}.acme.timer.{kind}", body, headers=headers or None
                    )
                    await until(lambda: consumer_idle(settings), what="the command acknowledged")
                    assert not replica.stop.is_set(), "the replica stopped"

                asyncio.run_coroutine_threadsafe(send(), loop).result(timeout=60)

            try:
                await asyncio.to_thread(one_command)  # hypothesis drives from a thread; the loop runs here
            finally:
                await nc.close()

    try:
        loop.run_until_complete(fuzz())
    finally:
        loop.close()
