"""Fault injection on the network between the replicas and the servers (tests/chaos/proxy.py):
replies cut after the work was done, latency and dropped connections, while the workload runs
(tests/chaos/scenario.py), then every timer checked."""

from __future__ import annotations

import pytest

from tests.chaos.proxy import Proxy
from tests.chaos.scenario import Chaos, MakeRun, passes
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres

pytestmark = pytest.mark.chaos


async def test_replies_lost_after_the_commit_or_the_puback(
    make_run: MakeRun, chaos_db: str, chaos_pg: EmbeddedPostgres, chaos_nats: EmbeddedNats
) -> None:
    """The work is done, the answer never comes: a record or an intake commit whose reply is cut
    after Postgres committed, a DueTimeReached whose PubAck is cut after JetStream stored it."""
    with Proxy("127.0.0.1", chaos_pg.port) as pg, Proxy("127.0.0.1", chaos_nats.port) as nats:
        run = make_run(
            "ambiguous", replica_db=pg.url_for(chaos_db), replica_nats=nats.url_for(chaos_nats.url)
        )
        cuts = [(pg, b"UPDATE "), (pg, b"COMMIT"), (nats, b'{"stream":"')]

        async def faults(c: Chaos) -> None:
            while await c.pause(1.0):
                proxy, pattern = c.rng.choice(cuts)
                proxy.cut_on_reply(pattern)
            c.faults = pg.cuts + nats.cuts

        await passes(run, faults)
        assert pg.cuts and nats.cuts, "no reply was ever cut: the scenario tested nothing"


async def test_slow_and_dropped_connections(
    make_run: MakeRun, chaos_db: str, chaos_pg: EmbeddedPostgres, chaos_nats: EmbeddedNats
) -> None:
    with Proxy("127.0.0.1", chaos_pg.port) as pg, Proxy("127.0.0.1", chaos_nats.port) as nats:
        run = make_run(
            "latency-drops", replica_db=pg.url_for(chaos_db), replica_nats=nats.url_for(chaos_nats.url)
        )

        async def faults(c: Chaos) -> None:
            for proxy in (pg, nats):
                proxy.set_latency(0.02, jitter=0.03)
            try:
                while await c.pause(3):
                    with c.outage():  # every replica's connection to it, at once
                        c.faults += c.rng.choice([pg, nats]).drop_all()
            finally:
                for proxy in (pg, nats):
                    proxy.set_latency(0)

        await passes(run, faults)
