"""The producer client: TimerClient, its consumer, its envelopes and the NATS wire it owns. It
imports only the contract, itself and nats-py, and OpenTelemetry when installed (tracecontext.py;
tests/unit/test_layout.py).

producer.py     TimerClient: schedule, cancel, pause, resume, get, the bulk sends
errors.py       what `get` raises: TimerClientError and its kinds, each also what it raised before
consumer.py     its DueTimeReached consumer (due_events), acknowledged in batches, read by many
acks.py         what due_events owes the server: the acks not yet sent, the events given out
pulls.py        the pull requests a due_events reader keeps open: how readers of one durable share it
envelopes.py    its commands' envelopes (Envelope), built in bulk
wire.py         the own NATS wire, every nats-py internal relied on and nowhere else: the
                connection never in clear when TLS is configured, the raw delivery hook,
                publish_all (a batch encoded as nats-py would, in one write)
batches.py      the atomic and fast-ingest batch protocols (the client's and the broker's)
closing.py      a connection closed within a bound whatever the server does
tracecontext.py the caller's OpenTelemetry trace context as headers of each command, when installed
"""

from worker.client.batches import Sent
from worker.client.errors import GetRefused, GetTimeout, NoReplica, TimerClientError
from worker.client.producer import FastIngest, TimerClient

__all__ = ["FastIngest", "GetRefused", "GetTimeout", "NoReplica", "Sent", "TimerClient", "TimerClientError"]
