"""tools/bench/soak.py against a real Postgres: the autovacuum setting it compares."""

from __future__ import annotations

import math
from pathlib import Path

from tests.helpers import query
from tools.bench.rig import Rig
from tools.bench.soak import _vacuum_cost_delay

RELOPTIONS_SQL = "SELECT reloptions FROM pg_class WHERE oid = 'timers'::regclass"


async def test_the_soak_sets_the_tables_vacuum_cost_delay_only_when_asked(
    pg_server_url: str, nats_url: str, tmp_path: Path
) -> None:
    said: list[str] = []
    async with Rig(pg_server_url, nats_url, tmp_path) as rig:
        # not asked: the migrations' own (0018_gentler_autovacuum.sql), left as it is
        assert await _vacuum_cost_delay(rig, None, said.append) == 5.0
        assert "autovacuum_vacuum_cost_delay=5" in query(rig.db_url, RELOPTIONS_SQL)[0][0]
        assert await _vacuum_cost_delay(rig, 2.5, said.append) == 2.5
        options = query(rig.db_url, RELOPTIONS_SQL)[0][0]
        assert "autovacuum_vacuum_cost_delay=2.5" in options
        assert "autovacuum_vacuum_scale_factor=0.01" in options  # the others kept
        await rig.db_.execute("ALTER TABLE timers RESET (autovacuum_vacuum_cost_delay)")
        assert math.isnan(await _vacuum_cost_delay(rig, None, said.append))  # the server's applies
    assert said == [
        "autovacuum_vacuum_cost_delay of timers: 5 ms (as the migrations left it)",
        "autovacuum_vacuum_cost_delay of timers: 2.5 ms (set by --vacuum-cost-delay-ms)",
        "autovacuum_vacuum_cost_delay of timers: the server's (none of the table's own)",
    ]
