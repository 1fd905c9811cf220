"""The `producer` scenario: how many ScheduleTimer commands a second one Python producer gets
stored with `TimerClient.schedule_many`, beside the naive producer (one `schedule` per round trip).

Issue 21's target: schedule_many ≥ 40,000 commands/s with NATS's default sync. Only commands
JetStream acknowledged count (`Sent.outcome == "accepted"`), into the command stream as the
service creates it (the Rig's broker, allow_atomic and all). The two producers take turns in
halves, so a slow moment of a shared machine hits both: their ratio is the figure that carries
over between hosts, the rates are this machine's.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from worker.client import TimerClient

if TYPE_CHECKING:  # scenarios imports this module to list it
    from tools.bench.scenarios import Context

# Commands per schedule_many call: what `timer-service import` sends at once (cli_timers.py).
CALL_SIZE = 10_000
HALVES = 2  # each producer runs twice, alternating: many, naive, many, naive


async def producer(ctx: Context) -> dict[str, float]:
    """schedule_many against schedule one by one, into the real command stream."""
    many_n = ctx.n(200_000)
    naive_n = ctx.n(4_000, floor=200)  # a few seconds at a round trip each
    due = datetime.now(UTC) + timedelta(days=1)
    async with ctx.rig() as rig:
        client = await TimerClient.connect(ctx.nats_url, rig.names["subject_prefix"])
        async with client:
            many = naive = 0
            many_s = naive_s = 0.0
            not_accepted = 0
            for half in range(HALVES):
                keys = range(half * many_n // HALVES, (half + 1) * many_n // HALVES)
                ctx.progress(f"schedule_many: {len(keys):,} commands in calls of {CALL_SIZE:,}")
                for i in range(keys.start, keys.stop, CALL_SIZE):
                    # The producer's own data, made before the clock starts: only the client's
                    # work and the server's are timed.
                    timers = [
                        {"tenantId": f"t{k % 10}", "serviceCallId": f"m-{k}", "dueAt": due}
                        for k in range(i, min(i + CALL_SIZE, keys.stop))
                    ]
                    started = time.perf_counter()
                    sent = await client.schedule_many(timers)
                    many_s += time.perf_counter() - started
                    accepted = sum(1 for s in sent if s.outcome == "accepted")
                    many += accepted
                    not_accepted += len(sent) - accepted
                keys = range(half * naive_n // HALVES, (half + 1) * naive_n // HALVES)
                ctx.progress(f"schedule, one by one: {len(keys):,} commands")
                started = time.perf_counter()
                for k in keys:
                    await client.schedule(f"t{k % 10}", f"n-{k}", due)  # returns once acknowledged
                    naive += 1
                naive_s += time.perf_counter() - started
        stream = await rig.nc_.jetstream().stream_info(rig.names["command_stream"])
        many_rate, naive_rate = many / many_s, naive / naive_s
        return {
            "commands": many,
            "commands_per_s": many_rate,
            "not_accepted": not_accepted,
            "naive_commands": naive,
            "naive_commands_per_s": naive_rate,
            "many_over_naive": many_rate / naive_rate,
            # Every accepted command is in the stream once: the count is of stored commands.
            "stored_missing": many + naive - stream.state.messages,
        }
