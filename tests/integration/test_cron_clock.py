"""A weekday 09:00 cron in Paris and New York across the four DST changes of 2027 (issue 23), on
a Postgres whose clock the test moves (libfaketime), a real replica and real NATS JetStream.

Only Postgres runs on the faked clock. The replica keeps the real one, months behind: it never
reads its own clock to decide what is due (worker/core/clock.py estimates the database clock
from each claim's reading), so it fires on 2027's instants while its host says 2026. That is the
rule the test holds it to.

Each move lands a fraction of a second before an occurrence, well inside TIMER_DOWNTIME_AFTER, so
no downtime rule applies: the replica claims it ahead (the claim's look-ahead) and must hold it
until it is due on the database clock. Saturdays and Sundays are passed too: the clock is moved
just past their 09:00 and the replica claims twice there, and nothing may fire.
"""

from __future__ import annotations

import glob
import json
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from tests.helpers import jetstream, publish_raw, row, running_replica, until
from tests.servers import delete_streams, own_names
from worker.adapters.postgres.migrations import migrate
from worker.config import Settings
from worker.devkit.embedded import EmbeddedPostgres
from worker.settings import load_settings

# Where the fake clock stands before an occurrence: past the claim's look-ahead (100 ms), so the
# replica holds a claimed occurrence until it is due, and far inside the downtime window (1 min).
BEFORE = timedelta(milliseconds=400)
PAST = timedelta(milliseconds=500)  # past a weekend 09:00: a Saturday occurrence would be due
# SELECT now() right after a move: at the target, plus however long the query took on a loaded machine.
MOVE_SLACK = timedelta(seconds=5)
EVENT_WAIT_S = 20  # an occurrence is claimed within a poll interval (0.2 s) of coming due


def faketime_library() -> str:
    found = glob.glob("/usr/lib/*/faketime/libfaketime.so.1")
    assert found, "libfaketime is missing: apt-get install libfaketime (make test installs it on Debian)"
    return found[0]


def at(month: int, day: int, hour: int) -> datetime:
    """An instant of 2027 in UTC, on the hour."""
    return datetime(2027, month, day, hour, tzinfo=UTC)


@dataclass(frozen=True)
class Window:
    """One timer: 09:00 local on weekdays from a Thursday before a DST change to the Tuesday after."""

    key: str
    zone: str
    thursday: date
    fires: tuple[datetime, ...]  # Thu, Fri, Mon, Tue at 09:00 local, in UTC, written out by hand

    def weekend(self) -> list[datetime]:
        """Saturday's and Sunday's 09:00 local, which must not fire."""
        days = (self.thursday + timedelta(days=n) for n in (2, 3))
        return [datetime(d.year, d.month, d.day, 9, tzinfo=ZoneInfo(self.zone)).astimezone(UTC) for d in days]

    def command(self) -> dict[str, Any]:
        tuesday = self.thursday + timedelta(days=5)
        return {
            "tenantId": "acme",
            "serviceCallId": self.key,
            "dueAt": f"{self.thursday.isoformat()}T00:00:00Z",
            "repeat": {
                "cron": "0 9 * * MON-FRI",
                "timezone": self.zone,
                "until": f"{tuesday.isoformat()}T23:59:59Z",
            },
        }


# New York: EST (UTC-5) until 2027-03-14, EDT (UTC-4) until 2027-11-07. Paris: CET (UTC+1) until
# 2027-03-28, CEST (UTC+2) until 2027-10-31. Each change is on a Sunday.
WINDOWS = [
    Window("new-york-spring", "America/New_York", date(2027, 3, 11),
           (at(3, 11, 14), at(3, 12, 14), at(3, 15, 13), at(3, 16, 13))),
    Window("paris-spring", "Europe/Paris", date(2027, 3, 25),
           (at(3, 25, 8), at(3, 26, 8), at(3, 29, 7), at(3, 30, 7))),
    Window("paris-autumn", "Europe/Paris", date(2027, 10, 28),
           (at(10, 28, 7), at(10, 29, 7), at(11, 1, 8), at(11, 2, 8))),
    Window("new-york-autumn", "America/New_York", date(2027, 11, 4),
           (at(11, 4, 13), at(11, 5, 13), at(11, 8, 14), at(11, 9, 14))),
]  # fmt: skip


class MovableClock:
    """The faked Postgres' clock. libfaketime reads an offset from the real clock out of `path` at
    every clock call (FAKETIME_NO_CACHE), so writing the file moves now() in every backend at once."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = timedelta(0)  # the database clock minus the real one
        self._write(self.offset)

    def env(self) -> dict[str, str]:
        return {
            "LD_PRELOAD": faketime_library(),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_NO_CACHE": "1",
            # Only the wall clock moves: Postgres' timeouts and latches run on the monotonic one.
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "NO_FAKE_STAT": "1",  # file times stay real
        }

    def move_to(self, instant: datetime, db_url: str) -> None:
        """Make the database clock read `instant` now (it runs on from there), and check it does."""
        self.offset = instant - datetime.now(UTC)
        self._write(self.offset)
        with psycopg.connect(db_url, autocommit=True) as conn:
            found = conn.execute("SELECT now()").fetchone()
        assert found is not None and instant <= found[0] < instant + MOVE_SLACK, (instant, found)

    def _write(self, offset: timedelta) -> None:
        # Whole or not at all (a rename): a backend reading a half-written file would see real time.
        new = self.path.with_suffix(".new")
        new.write_text(f"{offset.total_seconds():+.6f}s\n")
        new.chmod(0o644)  # Postgres may run as another user (embedded.py, when we are root)
        os.replace(new, self.path)


def _due_at(db_url: str, key: str) -> datetime | None:
    stored = row(db_url, "acme", key)
    return None if stored is None else stored["due_at"]  # type: ignore[no-any-return]


def _recorded(db_url: str, key: str, count: int) -> bool:
    """The timer's `count`th firing is recorded: counted, and no lease left on it."""
    stored = row(db_url, "acme", key)
    return stored is not None and stored["fired_count"] == count and stored["lease_expires_at"] is None


@pytest.fixture
def faked_pg(tmp_path: Path) -> Iterator[tuple[str, MovableClock]]:
    """A Postgres of this test's own on a movable clock (the session's stays on the real one): the
    URL of a migrated database on it, and its clock."""
    base = tmp_path / "faked-postgres"
    base.mkdir()
    clock = MovableClock(base / "faketime.rc")
    with EmbeddedPostgres(base, env=clock.env()) as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE DATABASE timers")
        url = pg.url_for("timers")
        migrate(url)
        yield url, clock


@pytest.fixture
async def clock_settings(faked_pg: tuple[str, MovableClock], nats_url: str) -> AsyncIterator[Settings]:
    tag = f"t{uuid.uuid4().hex[:8]}"
    db_url, _ = faked_pg
    yield load_settings(
        database_url=db_url, nats_url=nats_url, log_format="text", poll_interval_ms=200, **own_names(tag)
    )
    await delete_streams(nats_url, tag)


async def test_weekday_nine_oclock_fires_at_the_right_instants_across_the_dst_changes_of_2027(
    faked_pg: tuple[str, MovableClock], clock_settings: Settings
) -> None:
    db_url, clock = faked_pg
    s = clock_settings
    clock.move_to(datetime(2027, 3, 10, 12, tzinfo=UTC), db_url)  # the day before the first occurrence
    stops = sorted(
        [(at, w.key, True) for w in WINDOWS for at in w.fires]
        + [(at, w.key, False) for w in WINDOWS for at in w.weekend()]
    )
    claims = 0

    def claimed(_: str) -> None:
        nonlocal claims
        claims += 1

    async with running_replica(s) as replica, jetstream(s) as js:
        replica.firing.test_signal = claimed  # a signal, so "the replica claimed there" needs no sleep
        for w in WINDOWS:
            await publish_raw(js, s, "acme", "schedule", w.command())
        for w in WINDOWS:
            first = w.fires[0]
            await until(lambda k=w.key, t=first: _due_at(db_url, k) == t, what=f"{w.key} due on Thursday")
        sub = await js.pull_subscribe(f"{s.subject_prefix}.acme.timer.due", stream=s.event_stream)
        seen: list[tuple[str, str]] = []
        fired = dict.fromkeys((w.key for w in WINDOWS), 0)
        for at, key, fires in stops:
            if fires:
                clock.move_to(at - BEFORE, db_url)
                (msg,) = await sub.fetch(1, timeout=EVENT_WAIT_S)
                await msg.ack()
                payload = json.loads(msg.data)["payload"]
                seen.append((payload["serviceCallId"], payload["dueAt"]))
                assert seen[-1] == (key, at.strftime("%Y-%m-%dT%H:%M:%S.000Z"))
                # Published once due on the database clock, never before: as the replica says
                # (reachedAt, its estimate of that clock) and as JetStream saw it (when the stream
                # stored the event, on this host's real clock, moved by the database clock's offset).
                assert datetime.fromisoformat(payload["reachedAt"]) >= at, payload
                assert msg.metadata.timestamp + clock.offset >= at, (msg.metadata.timestamp, clock.offset)
                fired[key] += 1
                await until(lambda k=key: _recorded(db_url, k, fired[k]), what=f"{key}'s firing recorded")
            else:
                before = row(db_url, "acme", key)
                monday = next(w.fires[2] for w in WINDOWS if w.key == key)
                assert before is not None and before["due_at"] == monday  # Friday's next is Monday
                clock.move_to(at + PAST, db_url)
                # The claim in flight may have read the clock before the move; the next one did not.
                after_move = claims
                await until(lambda n=after_move: claims >= n + 2, what=f"two claims past {at}")
                assert row(db_url, "acme", key) == before  # not claimed, not fired: still due Monday
        info = await js.stream_info(s.event_stream)
    assert len(seen) == info.state.messages == sum(len(w.fires) for w in WINDOWS)  # no weekend one later
    for w in WINDOWS:
        stored = row(db_url, "acme", w.key)
        assert stored is not None and (stored["state"], stored["fired_count"]) == ("Reached", len(w.fires))
