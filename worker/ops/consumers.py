"""`timer-service consumer add --tenant acme`: the consumers a tenant reads, made by the operator.

A tenant allowed to create consumers chooses their configuration, `deliver_subject` included:
a push consumer on its own DLQ delivering onto the service's wake subject made every replica
claim without end (issue 31). So tenants get no CONSUMER.CREATE at all (docs/SECURITY.md, NATS
permissions for a tenant); the operator makes, once per tenant and stream, a durable consumer
named after the tenant, filtered to its subject:

- on the events stream, the pull consumer TimerClient.due_events reads (worker/client/consumer.py,
  pull_config), by any number of readers. due_events binds to it with CONSUMER.INFO alone, and
  asks for events with CONSUMER.MSG.NEXT, delivered to the tenant's own inbox prefix
  (`_INBOX_acme.…`, which only acme may subscribe to).
- on the DLQ stream, a pull consumer, read with CONSUMER.MSG.NEXT.

Both are made with the filter in the request subject (`$JS.API.CONSUMER.CREATE.<stream>.<name>.
<filter>`), so the server refuses any other filter. Running it again is harmless: the same
configuration is no change. A consumer of that name with another shape is refused with why: the
push consumer earlier releases provisioned on the events stream is to be deleted once no reader
is on it, then this run again (docs/SECURITY.md).
"""

from __future__ import annotations

import dataclasses

import nats.js.errors
from nats.js import JetStreamContext, api

from worker.client.consumer import pull_config
from worker.config import Settings
from worker.contract import Subjects


@dataclasses.dataclass(frozen=True)
class Provisioned:
    stream: str
    name: str
    filter_subject: str
    deliver_subject: str | None  # None: a pull consumer


def tenant_consumers(settings: Settings, tenant: str) -> list[tuple[str, api.ConsumerConfig]]:
    """(stream, configuration) of each consumer a tenant reads."""
    subjects = Subjects(settings.subject_prefix)
    events = pull_config()
    dlq = api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT)
    out = []
    for stream, config, subject in (
        (settings.event_stream, events, subjects.due(tenant)),
        (settings.dlq_stream, dlq, subjects.of(tenant, "dlq")),
    ):
        config.name = config.durable_name = tenant
        config.filter_subject = subject
        out.append((stream, config))
    return out


async def provision(js: JetStreamContext, settings: Settings, tenant: str) -> list[Provisioned]:
    """Create (or leave as they are) the tenant's consumers; what they are."""
    made = []
    for stream, config in tenant_consumers(settings, tenant):
        await _not_push(js, stream, tenant)
        info = await js.add_consumer(stream, config=config)
        made.append(Provisioned(stream, info.name, config.filter_subject or "", info.config.deliver_subject))
    return made


async def _not_push(js: JetStreamContext, stream: str, name: str) -> None:
    """Refuses, with what to do, the push consumer an earlier release provisioned: the server
    refuses to make it a pull consumer in place, in words that do not say so."""
    try:
        info = await js.consumer_info(stream, name)
    except nats.js.errors.NotFoundError:
        return
    if info.config.deliver_subject:
        raise ValueError(
            f"consumer {name} on {stream} is a push consumer (provisioned by an earlier release); "
            f"once no reader is on it, delete it (`nats consumer rm {stream} {name}`) and run this again"
        )
