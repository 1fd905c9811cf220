"""Whether fast-ingest batches cost this NATS server less than atomic ones: what
TIMER_EVENTS_FAST_INGEST=auto decides by for a single-replica events stream.

A fast batch stores each message as it comes, so a server under `sync_interval: always` fsyncs
every one of them, where an atomic batch costs one fsync; without it, fast batches are the
cheaper (a third of an atomic batch's time, docs/BENCHMARKS.md). No server API a client may call
says which sync a server runs, so a replica measures it: batches of each kind, alternated, sent
to a small stream of its own on the same storage, and the quickest of each compared. Either choice is as
durable as the server makes it; a wrong one costs speed only."""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from typing import TYPE_CHECKING

from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from worker.contract import FAST_BATCHES, Outgoing, Subjects

if TYPE_CHECKING:
    from worker.adapters.jetstream.publisher import Publisher
    from worker.config import Settings

log = logging.getLogger(__name__)

# Messages per batch: a backlog's batches are larger, so fsyncs per message show plainly (under
# `sync_interval: always` fast batches of 100 took 5 x an atomic one here, without it 0.3 x).
PROBE_SIZE = 100
PROBE_ROUNDS = 5  # batches of each kind
# A measure recorded on the probe stream (its metadata) is taken as it is for this long: replicas
# started later, into a backlog, need not measure under its load (and fire in fast batches from
# their first). A server's sync setting changes seldom; deleting that stream measures again.
MEASURE_EVERY_S = 24 * 3600
MEASURED_AT = "timer-service.fast-batches-at"  # when, in epoch seconds


def probe_stream(s: Settings, subjects: Subjects, events: api.StreamConfig) -> api.StreamConfig:
    """The probe's stream: the events stream's storage, one replica, a few seconds of messages."""
    return api.StreamConfig(
        name=f"{s.event_stream}_PROBE",
        description="timer-service: fast-ingest against atomic batches (TIMER_EVENTS_FAST_INGEST=auto)",
        subjects=[subjects.probe],
        storage=events.storage,
        num_replicas=1,
        max_msgs=4 * PROBE_SIZE,
        max_age=60,
        duplicate_window=10,
        discard=api.DiscardPolicy.OLD,
        allow_atomic=True,
        allow_batched=True,
    )


async def fast_batches_cheaper(
    js: JetStreamContext, publisher: Publisher, config: api.StreamConfig, timeout: float
) -> bool:
    """Whether fast-ingest batches take less time than atomic ones on `config`'s stream (made
    when missing): as recorded in its metadata within MEASURE_EVERY_S, else measured now and
    recorded there (FAST_BATCHES, which producers read too). Raises what NATS raises, and
    RuntimeError when a probe message is refused."""
    assert config.name is not None
    try:
        made = (await js.stream_info(config.name)).config
    except NotFoundError:
        made = (await js.add_stream(config)).config
    if not (made.allow_atomic and getattr(made, "allow_batched", False)):
        # Measured there, a refusal would turn either kind off for the events too (Publisher).
        raise RuntimeError(f"stream {config.name} takes not both atomic and fast-ingest batches")
    said = made.metadata or {}
    with contextlib.suppress(KeyError, ValueError):
        if said[FAST_BATCHES] in ("on", "off") and time.time() - float(said[MEASURED_AT]) < MEASURE_EVERY_S:
            return said[FAST_BATCHES] == "on"
    cheaper = await _measure(publisher, config, timeout)
    made.metadata = {**said, FAST_BATCHES: "on" if cheaper else "off", MEASURED_AT: str(round(time.time()))}
    await js.update_stream(made)
    return cheaper


async def _measure(publisher: Publisher, config: api.StreamConfig, timeout: float) -> bool:
    """Alternated batches of each kind; whether the quickest fast one beat the quickest atomic."""
    assert config.subjects
    subject, token = config.subjects[0], uuid.uuid4().hex
    took: dict[bool, list[float]] = {True: [], False: []}
    for r in range(PROBE_ROUNDS):
        for fast in (True, False) if r % 2 == 0 else (False, True):
            ids = (f"{token}.{r}.{fast:d}.{i}" for i in range(PROBE_SIZE))
            batch = [Outgoing(subject, b"{}", {"Nats-Msg-Id": i}) for i in ids]
            started = time.perf_counter()
            send = publisher.publish_fast if fast else publisher.publish_batches
            if errors := [e for e in await send(batch, timeout) if e is not None]:
                raise RuntimeError(f"probe stream {config.name}: {errors[0]}")
            took[fast].append(time.perf_counter() - started)
    # The quickest of each: replicas starting together probe the same server at once, and a
    # moment of that contention lengthens a batch of either kind; none shortens one.
    fast_s, atomic_s = min(took[True]), min(took[False])
    log.info(
        "batches measured",
        extra={
            "action": "batches_measured",
            "fast_ms": round(fast_s * 1000, 2),
            "atomic_ms": round(atomic_s * 1000, 2),
            "size": PROBE_SIZE,
        },
    )
    return fast_s < atomic_s
