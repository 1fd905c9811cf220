"""Whether fast-ingest batches cost this NATS server less than atomic ones (TIMER_EVENTS_FAST_INGEST=auto):
no API says if it fsyncs each message, so a replica measures; a wrong choice costs speed only."""

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

# Messages per batch: enough that fsyncs per message show plainly.
PROBE_SIZE = 100
PROBE_ROUNDS = 5  # batches of each kind
# A measure recorded on the probe stream holds this long, so replicas started into a backlog need
# not measure under its load; deleting that stream measures again.
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
    """Whether fast-ingest batches are the quicker on `config`'s stream (made when missing): as
    recorded in its metadata within MEASURE_EVERY_S, else measured."""
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
    # The quickest of each: replicas probing at once only ever lengthen a batch.
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
