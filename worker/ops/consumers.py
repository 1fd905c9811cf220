"""`timer-service consumer add --tenant acme`: the consumers a tenant reads, made by the operator.

A tenant allowed to create consumers chooses their configuration, `deliver_subject` included:
a push consumer on its own DLQ delivering onto the service's wake subject made every replica
claim without end (issue 31). So tenants get no CONSUMER.CREATE at all (docs/SECURITY.md, NATS
permissions for a tenant); the operator makes, once per tenant and stream, a durable consumer
named after the tenant, filtered to its subject:

- on the events stream, the push consumer TimerClient.due_events reads (worker/client/consumer.py,
  push_config), delivering to a subject under the tenant's own inbox prefix (`_INBOX_acme.…`,
  which only acme may subscribe to). due_events binds to it with CONSUMER.INFO alone.
- on the DLQ stream, a pull consumer, read with CONSUMER.MSG.NEXT.

Both are made with the filter in the request subject (`$JS.API.CONSUMER.CREATE.<stream>.<name>.
<filter>`), so the server refuses any other filter. Running it again is harmless: the same
configuration is no change. A consumer of that name with another shape (a pull consumer on the
events stream, made under the earlier permissions) is refused with the server's reason.
"""

from __future__ import annotations

import dataclasses

from nats.js import JetStreamContext, api

from worker.client.consumer import push_config
from worker.config import Settings
from worker.contract import Subjects, tenant_inbox


@dataclasses.dataclass(frozen=True)
class Provisioned:
    stream: str
    name: str
    filter_subject: str
    deliver_subject: str | None  # None: a pull consumer


def tenant_consumers(settings: Settings, tenant: str) -> list[tuple[str, api.ConsumerConfig]]:
    """(stream, configuration) of each consumer a tenant reads."""
    subjects = Subjects(settings.subject_prefix)
    events = push_config()
    events.deliver_subject = f"{tenant_inbox(tenant)}.{settings.event_stream}"
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
        info = await js.add_consumer(stream, config=config)
        made.append(Provisioned(stream, info.name, config.filter_subject or "", info.config.deliver_subject))
    return made
