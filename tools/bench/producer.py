"""`producer`: ScheduleTimer commands a second one producer gets stored with `schedule_many` (as
the client chooses, "auto", and in fast-ingest batches) beside one `schedule` per round trip,
taking turns in halves; only commands JetStream accepted count."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tools.bench.rig import Context
from worker.client import TimerClient

# Commands per schedule_many call: what `timer-service import` sends at once (cli_timers.py).
CALL_SIZE = 10_000
HALVES = 2  # each producer runs twice, alternating: many, naive, many, naive


async def producer(ctx: Context) -> dict[str, float]:
    many_n = ctx.n(200_000)
    naive_n = ctx.n(4_000, floor=200)  # a few seconds at a round trip each
    due = datetime.now(UTC) + timedelta(days=1)
    async with ctx.rig() as rig:
        prefix = rig.names["subject_prefix"]
        client = await TimerClient.connect(ctx.nats_url, prefix)
        fast = await TimerClient.connect(ctx.nats_url, prefix, fast_ingest="on")
        async with client, fast:
            many = Bulk(due)
            fast_many = Bulk(due)
            naive = 0
            naive_s = 0.0
            for half in range(HALVES):
                keys = range(half * many_n // HALVES, (half + 1) * many_n // HALVES)
                ctx.progress(f"schedule_many: {len(keys):,} commands in calls of {CALL_SIZE:,}")
                await many.send(client, "m", keys)
                ctx.progress(f"schedule_many, fast batches: {len(keys):,} commands")
                await fast_many.send(fast, "f", keys)
                keys = range(half * naive_n // HALVES, (half + 1) * naive_n // HALVES)
                ctx.progress(f"schedule, one by one: {len(keys):,} commands")
                started = time.perf_counter()
                for k in keys:
                    await client.schedule(f"t{k % 10}", f"n-{k}", due)  # returns once acknowledged
                    naive += 1
                naive_s += time.perf_counter() - started
            assert fast._fast, "the command stream takes fast batches"
        stream = await rig.nc_.jetstream().stream_info(rig.names["command_stream"])
        many_rate, naive_rate = many.accepted / many.seconds, naive / naive_s
        fast_rate = fast_many.accepted / fast_many.seconds
        return {
            "commands": many.accepted,
            "commands_per_s": many_rate,
            "not_accepted": many.not_accepted + fast_many.not_accepted,
            "fast_commands": fast_many.accepted,
            "fast_commands_per_s": fast_rate,
            "fast_over_auto": fast_rate / many_rate,
            "naive_commands": naive,
            "naive_commands_per_s": naive_rate,
            "many_over_naive": many_rate / naive_rate,
            # Every accepted command is in the stream once: the count is of stored commands.
            "stored_missing": many.accepted + fast_many.accepted + naive - stream.state.messages,
        }


class Bulk:
    """One bulk producer's tally: accepted, not accepted, seconds in schedule_many."""

    def __init__(self, due: datetime) -> None:
        self.due = due
        self.accepted = self.not_accepted = 0
        self.seconds = 0.0

    async def send(self, client: TimerClient, tag: str, keys: range) -> None:
        for i in range(keys.start, keys.stop, CALL_SIZE):
            # made before the clock starts: only the client's and the server's work are timed
            timers = [
                {"tenantId": f"t{k % 10}", "serviceCallId": f"{tag}-{k}", "dueAt": self.due}
                for k in range(i, min(i + CALL_SIZE, keys.stop))
            ]
            started = time.perf_counter()
            sent = await client.schedule_many(timers)
            self.seconds += time.perf_counter() - started
            accepted = sum(1 for s in sent if s.outcome == "accepted")
            self.accepted += accepted
            self.not_accepted += len(sent) - accepted
