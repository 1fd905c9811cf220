"""The intake loop (worker/core/intake.py): on twins (tests/twins.py), when a command is
acknowledged and what happens to it; and that it outlives NATS trouble: what a fetch raises is
logged and the loop goes on."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import nats.errors
from nats.aio.msg import Msg
from prometheus_client import REGISTRY

from tests.twins import FakeClock, FakeTime, TwinBroker, TwinStore, claim_params
from worker.config import Settings
from worker.contract import Command
from worker.core.domain import Applied, Outcome, Position
from worker.core.intake import BUSY_RETRY_S, RETRY_DELAY_S, Intake
from worker.core.ports import FetchFailed
from worker.core.wakeup import Wakeup
from worker.settings import load_settings


def command(kind: str, tenant: str, key: str, due: datetime | None = None, ts: int = 1) -> dict[str, Any]:
    payload: dict[str, Any] = {"tenantId": tenant, "serviceCallId": key}
    if due is not None:
        payload["dueAt"] = due.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return {"id": f"{key}-{ts}", "type": kind, "tenantId": tenant, "timestampMs": ts, "payload": payload}


def setup(
    settings: Settings | None = None, store_type: type[TwinStore] = TwinStore
) -> tuple[FakeTime, TwinStore, TwinBroker, Intake]:
    time = FakeTime(datetime.now(UTC).timestamp())  # intake validates dueAt against its own clock
    s = settings or load_settings(worker_id="unit", lease_ms=3000)
    store, broker = store_type(time), TwinBroker(time, s.subject_prefix)
    broker.acks.shared = store.log
    clock = FakeClock(time)
    return time, store, broker, Intake(s, store, broker, Wakeup(clock), clock)


async def fetch_and_handle(broker: TwinBroker, intake: Intake) -> None:
    """One batch through intake, then the bulk lane's steps until it holds nothing."""
    await intake.handle(await (await broker.command_subscription()).fetch(100, 1.0))
    while await intake.lane.step():
        pass


async def test_commands_are_acknowledged_only_after_their_batch_is_committed() -> None:
    time, store, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)
    for key in ("a", "b", "c"):
        broker.add(broker.subjects.of("acme", "schedule"), command("ScheduleTimer", "acme", key, due))
    await fetch_and_handle(broker, intake)
    events = [kind for kind, _ in store.log]
    assert events == ["apply", "ack", "ack", "ack"]
    assert [c.service_call_id for c in store.log[0][1]] == ["a", "b", "c"]
    assert all(r.state == "Scheduled" for r in store.rows.values())


async def test_a_command_for_a_claimed_occurrence_waits_a_lease_and_is_not_acknowledged() -> None:
    time, store, broker, intake = setup()
    now = datetime.fromtimestamp(time.t, UTC)
    broker.add(broker.subjects.of("acme", "schedule"), command("ScheduleTimer", "acme", "k", now))
    await fetch_and_handle(broker, intake)
    await store.claim(claim_params("firing", 10, 0, lease_ms=3000))  # its occurrence is being fired
    cancel = broker.add(broker.subjects.of("acme", "cancel"), command("CancelTimer", "acme", "k", ts=2))
    await fetch_and_handle(broker, intake)
    assert broker.acks.of(cancel.metadata.sequence.stream) == ['-NAK {"delay": 3000000000}']
    assert store.rows["acme", "k"].state == "Scheduled"


class RowHeldBesideABatch(TwinStore):
    """The Store when a claim's batch holds a timer's row it did not claim (sql/queries/intake.sql,
    lock_keys): that key's commands come out "busy". The twin has no such lock of its own."""

    held: tuple[str, str] = ("acme", "held")

    async def apply(
        self, commands: Sequence[Command], positions: Sequence[Position] | None = None
    ) -> Applied:
        applied = await super().apply(commands, positions)
        busy: Outcome = "busy"
        outcomes = [
            busy if (c.tenant_id, c.service_call_id) == self.held else o
            for c, o in zip(commands, applied.outcomes, strict=True)
        ]
        return Applied(outcomes, applied.soonest_due)


async def test_a_command_for_a_row_a_batch_holds_and_does_not_fire_comes_back_soon() -> None:
    _, _, broker, intake = setup(store_type=RowHeldBesideABatch)
    held = broker.add(broker.subjects.of("acme", "cancel"), command("CancelTimer", "acme", "held", ts=2))
    free = broker.add(broker.subjects.of("acme", "cancel"), command("CancelTimer", "acme", "free", ts=2))
    await fetch_and_handle(broker, intake)
    assert broker.acks.of(held.metadata.sequence.stream) == [f'-NAK {{"delay": {int(BUSY_RETRY_S * 1e9)}}}']
    assert broker.acks.of(free.metadata.sequence.stream) == ["+ACK"]
    assert intake.s.lease_ms / 1000 > BUSY_RETRY_S


async def test_garbage_goes_to_the_dlq_before_it_is_acknowledged_and_stays_when_the_dlq_fails() -> None:
    _, _, broker, intake = setup()
    bad = broker.add(broker.subjects.of("acme", "schedule"), b"{not json")
    broker.fail = lambda m: ConnectionError("dlq down")
    await fetch_and_handle(broker, intake)
    assert broker.acks.of(bad.metadata.sequence.stream) == [f'-NAK {{"delay": {int(RETRY_DELAY_S * 1e9)}}}']
    assert not broker.stored  # nothing copied, nothing lost: the command comes back
    broker.fail = lambda m: None
    broker.redeliver(bad)
    await fetch_and_handle(broker, intake)
    (copy,) = broker.stored.values()
    assert copy.subject == broker.subjects.of("acme", "dlq") and copy.payload == b"{not json"
    assert copy.headers["Timer-Error"] == "invalid_json"
    assert broker.acks.of(bad.metadata.sequence.stream)[-1] == "+ACK"


async def test_a_dlq_copys_id_reads_the_stored_time_as_it_always_has() -> None:
    """Rounded to the microsecond, as nats-py reads it: a command copied before an upgrade and
    redelivered after must get the same Nats-Msg-Id, or the DLQ would hold it twice."""
    _, _, broker, intake = setup()
    # stored at 2026-11-24T05:00:00.000001700Z: rounds to ...002 µs, truncates to ...001
    reply = "$JS.ACK.TIMER_COMMANDS.timer-service.1.7.7.1795496400000001700.0"
    broker.queue.append(Msg(_client=broker.acks, subject="timer.acme.timer.schedule", reply=reply, data=b"{"))  # type: ignore[arg-type]
    await fetch_and_handle(broker, intake)
    (copy,) = broker.stored.values()
    rounded = datetime(2026, 11, 24, 5, 0, 0, 2, tzinfo=UTC)
    assert copy.headers["Nats-Msg-Id"] == broker.ids.derived(intake.s.command_stream, 7, rounded)


async def test_a_near_timer_wakes_the_local_loop_and_the_fleet() -> None:
    time, _, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 0.5, UTC)
    broker.add(broker.subjects.of("acme", "schedule"), command("ScheduleTimer", "acme", "soon", due))
    await fetch_and_handle(broker, intake)
    ((subject, payload),) = broker.hints
    assert subject == broker.subjects.wake and float(payload) == round(due.timestamp(), 3)


class FlakySubscription:
    """Fails each fetch with the next error; then stops the loop."""

    def __init__(self, errors: list[Exception], stop: asyncio.Event) -> None:
        self.errors, self.stop, self.fetches = errors, stop, 0
        self.unsubscribed = False

    async def fetch(self, batch: int, timeout: float) -> list[Any]:
        self.fetches += 1
        if self.errors:
            raise self.errors.pop(0)
        self.stop.set()
        return []

    async def unsubscribe(self) -> None:  # intake lets go of its subscription when it stops
        self.unsubscribed = True


class Broker:
    def __init__(self, sub: FlakySubscription) -> None:
        self.sub = sub
        self.checks = 0

    async def command_subscription(self) -> FlakySubscription:
        return self.sub

    def check_streams_soon(self) -> None:
        self.checks += 1


async def test_intake_survives_a_stream_without_leader_and_a_reconnect() -> None:
    stop = asyncio.Event()
    errors: list[Exception] = [
        # what the broker makes of a 503 (the consumer's leader is being re-elected) and of a
        # reconnect (tests/unit/adapters/jetstream/test_streams.py)
        FetchFailed("ServiceUnavailableError: nats: service unavailable"),
        FetchFailed("ConnectionReconnectingError: nats: connection reconnecting"),
        nats.errors.TimeoutError(),  # nothing came: nats-py's timeout is a TimeoutError
    ]
    sub = FlakySubscription(errors, stop)
    broker = Broker(sub)
    intake = Intake(load_settings(), store=None, broker=broker, wakeup=None, clock=None)  # type: ignore[arg-type]
    await asyncio.wait_for(intake.run(stop), timeout=10)
    assert sub.fetches == 4
    assert broker.checks == 2, "a 503 may be a deleted consumer: each failure has the streams checked"
    assert sub.unsubscribed, "a stopped intake lets go of its subscription, so the drain is quick"


async def test_a_batch_is_counted_per_kind_and_outcome_as_one_by_one() -> None:
    """Intake adds up a batch's counts before it touches the metrics (one labels() per label set):
    the totals are what counting each command gave."""
    time, _, broker, intake = setup()
    due = datetime.fromtimestamp(time.t + 60, UTC)

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    before = {
        "received": sample("timer_commands_received_total", kind="schedule"),
        "cancels": sample("timer_commands_received_total", kind="cancel"),
        "applied": sample("timer_commands_applied_total", kind="schedule", outcome="applied"),
    }
    for key in ("a", "b", "c"):
        broker.add(broker.subjects.of("acme", "schedule"), command("ScheduleTimer", "acme", key, due))
    broker.add(broker.subjects.of("acme", "cancel"), command("CancelTimer", "acme", "zz", ts=2))
    await fetch_and_handle(broker, intake)
    assert sample("timer_commands_received_total", kind="schedule") - before["received"] == 3
    assert sample("timer_commands_received_total", kind="cancel") - before["cancels"] == 1
    assert sample("timer_commands_applied_total", kind="schedule", outcome="applied") - before["applied"] == 3
