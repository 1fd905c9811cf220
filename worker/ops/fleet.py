"""What NATS says about the fleet: the command backlog and the replicas taking commands.

Nothing new is run for this: it is the shared command consumer's own state (JetStream consumer
info), one request. `pullers` counts the pull requests waiting on that consumer; every replica
keeps one outstanding while it is idle (intake re-issues its 1 s fetch at once), so it is about
the number of live replicas whose intake runs. A replica that is up but stuck elsewhere still
counts; one that is down stops counting within a second. That answers "is anyone taking my
commands?" without a heartbeat table; `status` shows the replicas holding leases beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from worker.adapters.jetstream.streams import command_stream_now
from worker.config import Settings


@dataclass(frozen=True, slots=True)
class CommandBacklog:
    pending: int  # stored, not yet handed to any replica
    in_flight: int  # handed to a replica, not yet acknowledged (being applied, or its replica died)
    pullers: int  # pull requests waiting: about one per live replica

    @property
    def waiting(self) -> int:
        return self.pending + self.in_flight

    def as_dict(self) -> dict[str, int]:
        return {"pending": self.pending, "inFlight": self.in_flight, "pullers": self.pullers}

    def line(self) -> str:
        takers = (
            f"{self.pullers} replica(s) taking commands"
            if self.pullers
            else "no replica is taking commands (none running, or none ready)"
        )
        return f"{self.pending} queued, {self.in_flight} being applied; {takers}"


async def command_backlog(js: JetStreamContext, settings: Settings) -> CommandBacklog | None:
    """The shared command consumer's backlog, or None when no replica has created it yet. After a
    cut-over (migrate-streams), the new stream's, plus what the old one still holds."""
    now = await command_stream_now(js, settings)
    try:
        info = await js.consumer_info(now, settings.consumer)
    except NotFoundError:
        return None
    backlog = CommandBacklog(
        pending=int(info.num_pending or 0),
        in_flight=int(info.num_ack_pending or 0),
        pullers=int(info.num_waiting or 0),
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
        )
    return backlog
