"""What NATS says about the fleet: the command backlog and whether replicas are taking commands.

Nothing new is run for this: it is the shared command consumer's own state (JetStream consumer
info), one request. Two of its figures show a replica at work, and neither alone suffices:
`pullers`, the pull requests waiting on the consumer, is one per idle replica (intake re-issues
its 1 s fetch at once) but none for a busy one (its request ends as soon as it delivered a batch,
and it asks again only once that batch is applied: under a steady load there is mostly none
out); the consumer's last acknowledgement (`ack_floor.last_active`) shows a busy fleet but not how
many replicas it has. So a replica is taking commands when NATS shows one at it (a pull waiting,
or a command acknowledged in the last RECENT_S), and how many are is the replicas whose minute
stats are fresh (worker/ops/fleet_stats.py, written every 15 s and at start), given by the caller
from the database: a fleet that stops is told within RECENT_S; one replica of several that
stops, within fleet_stats.ALIVE_S.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from nats.js import JetStreamContext
from nats.js.api import ConsumerInfo
from nats.js.errors import NotFoundError

from worker.adapters.jetstream.streams import command_stream_now
from worker.config import Settings

# A command acknowledged this recently shows a replica at work. Above the longest a healthy batch
# takes to be applied (a fetch waits 1 s; a batch of 1000 commits in well under a second), so a
# busy fleet never reads as stopped; below the minute an operator waits before acting. Measured
# on this machine's clock against the server's: keep them in step (NTP).
RECENT_S = 10.0


@dataclass(frozen=True, slots=True)
class CommandBacklog:
    pending: int  # stored, not yet handed to any replica
    in_flight: int  # handed to a replica, not yet acknowledged (being applied, or its replica died)
    pullers: int  # pull requests waiting: one per idle replica, none for a busy one
    applied_ago_s: float | None  # since a replica last acknowledged a command (None: never)
    running: int = 0  # replicas whose minute stats are fresh (fleet_stats.running), from the caller

    @property
    def waiting(self) -> int:
        return self.pending + self.in_flight

    @property
    def taking(self) -> int:
        """The replicas taking commands: none unless NATS shows one at it, else every running one
        (at least those NATS shows waiting, and one)."""
        at_it = self.pullers or (self.applied_ago_s is not None and self.applied_ago_s <= RECENT_S)
        return max(self.running, self.pullers, 1) if at_it else 0

    def as_dict(self) -> dict[str, int | float | None]:
        return {
            "pending": self.pending,
            "inFlight": self.in_flight,
            "taking": self.taking,
            "pullers": self.pullers,
            "appliedAgoS": self.applied_ago_s,
        }

    def line(self) -> str:
        takers = (
            f"{self.taking} replica(s) taking commands"
            if self.taking
            else "no replica is taking commands (none running, or none ready)"
        )
        return f"{self.pending} queued, {self.in_flight} being applied; {takers}"


def _applied_ago_s(info: ConsumerInfo) -> float | None:
    last = info.ack_floor.last_active if info.ack_floor is not None else None
    return None if last is None else max(0.0, (datetime.now(UTC) - last).total_seconds())


async def command_backlog(
    js: JetStreamContext, settings: Settings, running: int = 0
) -> CommandBacklog | None:
    """The shared command consumer's backlog, or None when no replica has created it yet; `running`
    is how many replicas wrote their stats lately (fleet_stats.running). After a cut-over
    (migrate-streams), the new stream's, plus what the old one still holds."""
    now = await command_stream_now(js, settings)
    try:
        info = await js.consumer_info(now, settings.consumer)
    except NotFoundError:
        return None
    backlog = CommandBacklog(
        pending=int(info.num_pending or 0),
        in_flight=int(info.num_ack_pending or 0),
        pullers=int(info.num_waiting or 0),
        applied_ago_s=_applied_ago_s(info),
        running=running,
    )
    if now != settings.command_stream:
        try:
            old = await js.consumer_info(settings.command_stream, settings.consumer)
        except NotFoundError:
            return backlog
        backlog = CommandBacklog(
            pending=backlog.pending + int(old.num_pending or 0),
            in_flight=backlog.in_flight + int(old.num_ack_pending or 0),
            pullers=backlog.pullers,
            applied_ago_s=min(
                (a for a in (backlog.applied_ago_s, _applied_ago_s(old)) if a is not None), default=None
            ),
            running=running,
        )
    return backlog
