"""Labels end to end (docs/CONTRACT.md, Labels), on real Postgres and JetStream with in-process
replicas: carried by a timer, shown by get, in every DueTimeReached, replaced by a newer
ScheduleTimer; a cancel, pause or resume by labels acting on its tenant's timers carrying every pair,
and on no other tenant's; labels within their bound as Postgres stores and prints them."""

from __future__ import annotations

import asyncio
import itertools
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import (
    due_events,
    jetstream,
    property_settings,
    query,
    recorder,
    row,
    running_replica,
    until,
)
from tests.unit.core.test_commands_labels import widest_bytes
from worker.adapters.postgres.store import Store
from worker.client import TimerClient
from worker.config import Settings
from worker.contract import MAX_LABEL_VALUE_CHARS, MAX_LABELS, Rejection, ScheduleTimer
from worker.core.commands import parse_command
from worker.core.domain import BulkAction

BF = {"campaign": "black-friday"}
HORIZON = timedelta(days=9999)


def _state(db_url: str, tenant: str, key: str) -> str | None:
    found = row(db_url, tenant, key)
    return None if found is None else str(found["state"])


async def _client(settings: Settings) -> TimerClient:
    return TimerClient(await nats.connect(settings.nats_url), settings.subject_prefix, owns_connection=True)


async def test_labels_are_shown_by_get_carried_by_events_and_replaced_like_data(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings), jetstream(settings) as js, await _client(settings) as client:
        soon = datetime.now(UTC) + timedelta(milliseconds=300)
        await client.schedule("acme", "sc-1", soon, labels={**BF, "tier": "gold ✨"})
        ((event, _),) = await due_events(js, settings, 1)
        assert event["labels"] == {**BF, "tier": "gold ✨"}
        view = await client.get("acme", "sc-1")
        assert view is not None and view["labels"] == {**BF, "tier": "gold ✨"}
        later = datetime.now(UTC) + timedelta(hours=1)
        await client.schedule("acme", "sc-2", later, labels=BF)
        await until(lambda: row(db_url, "acme", "sc-2") is not None)
        await client.schedule("acme", "sc-2", later)  # a reschedule without labels clears them
        await until(lambda: (row(db_url, "acme", "sc-2") or {}).get("labels") is None, what="labels cleared")
        view = await client.get("acme", "sc-2")
        assert view is not None and view["labels"] == {}


async def test_a_cancel_by_labels_cancels_its_tenants_timers_carrying_every_pair_and_none_of_another(
    settings: Settings, db_url: str
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    async with running_replica(settings), await _client(settings) as client:
        for tenant in ("acme", "evil"):  # the same labels on another tenant's timers
            await client.schedule(tenant, "both", later, labels={**BF, "tier": "gold"})
            await client.schedule(tenant, "one", later, labels=BF)
            await client.schedule(tenant, "none", later)
        await until(lambda: _state(db_url, "evil", "none") == "Scheduled", what="every timer stored")
        await client.cancel("acme", labels={**BF, "tier": "gold"})
        await until(lambda: _state(db_url, "acme", "both") == "Cancelled", what="the bulk cancel")
        # A later command of the tenant is applied after the bulk one: it has been handled by now.
        await client.cancel("acme", "none")
        await until(lambda: _state(db_url, "acme", "none") == "Cancelled", what="a later cancel")
    assert _state(db_url, "acme", "one") == "Scheduled"
    assert {_state(db_url, "evil", k) for k in ("both", "one", "none")} == {"Scheduled"}


async def test_a_pause_by_labels_holds_those_timers_and_a_resume_fires_them(
    settings: Settings, db_url: str
) -> None:
    later = datetime.now(UTC) + timedelta(hours=1)
    async with running_replica(settings), recorder(settings) as rec, await _client(settings) as client:
        await client.pause("acme", labels=BF)  # before the timers: changes nothing
        await client.schedule("acme", "held", later, labels=BF)
        await client.schedule("acme", "free", later, labels={"campaign": "other"})
        await until(lambda: _state(db_url, "acme", "free") == "Scheduled", what="stored")
        assert _state(db_url, "acme", "held") == "Scheduled"
        await client.pause("acme", labels=BF)
        await until(lambda: _state(db_url, "acme", "held") == "Paused", what="the bulk pause")
        # Both due now, labels restated: a paused timer rescheduled stays paused.
        now = datetime.now(UTC)
        await client.schedule("acme", "held", now, labels=BF)
        await client.schedule("acme", "free", now, labels={"campaign": "other"})
        assert await rec.wait_for({("acme", "free")}, timeout=10)
        # Due with the free one, which fired: the held one did not.
        assert ("acme", "held") not in rec.keys()  # noqa: SIM118
        assert _state(db_url, "acme", "held") == "Paused"
        await client.resume("acme", labels=BF)
        assert await rec.wait_for({("acme", "free"), ("acme", "held")}, timeout=10)


keys = st.from_regex(r"[a-z0-9_.-]{1,63}", fullmatch=True)
values = st.text(st.characters(codec="utf-8"), max_size=MAX_LABEL_VALUE_CHARS)


async def test_accepted_labels_are_stored_and_printed_within_their_bound(store: Store, db_url: str) -> None:
    """Whatever labels a tenant sends and the boundary accepts, Postgres stores them, and prints
    them as the events and get carry them (jsonb's text), within the widest labels the event
    bound counts; and a selector of any of them finds the timer."""
    loop = asyncio.get_running_loop()
    ids = (f"k{i}" for i in itertools.count())

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(timeout=60)

    @property_settings(40)
    @given(labels=st.dictionaries(keys, values, max_size=MAX_LABELS))
    def one(labels: dict[str, str]) -> None:
        key = next(ids)
        body = {"tenantId": "acme", "serviceCallId": key, "dueAt": "2030-01-01T00:00:00Z", "labels": labels}

        parsed = parse_command(
            "schedule",
            "acme",
            json.dumps(body).encode(),
            now=datetime.now(UTC),
            max_horizon=timedelta(days=9999),
        )
        if isinstance(parsed, Rejection):
            assert parsed.reason == "bad_labels"
            return
        assert isinstance(parsed, ScheduleTimer)
        run(store.apply([parsed]))
        (printed,) = query(db_url, "SELECT labels::text FROM timers WHERE service_call_id = %s", key)[0]
        if not labels:
            assert printed is None
            return
        assert len(printed.encode()) <= widest_bytes()
        assert json.loads(printed) == labels
        found = run(store.select_labelled(BulkAction("acme", labels, "cancel"), None, "", 1000))
        assert key in found

    await asyncio.to_thread(one)
