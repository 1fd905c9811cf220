"""An update of the command stream's config while a replica runs (its metadata, as the
migrate-streams cut-over writes SUCCESSOR; a subject added, as an upgrade does in
Broker._add_command_subjects): intake goes on applying commands at once. nats-server (2.15)
leaves the stream's consumers and their waiting pull requests alone on such an update: it resets
a consumer's requests only when the consumer's leadership changes."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from nats.js import api

from tests.helpers import iso_in, jetstream, publish_raw, row, running_replica, until
from worker.config import Settings

# A pull request of intake's is out at the server nearly all the time; a command is applied tens of
# ms after its publish. Had the update dropped that request without a status, intake would ask
# again only FORGET_AFTER_S (1 s) after its expiry: a command sent after the update would wait at
# least 1 s (measured by making one request go unanswered: 1.005 s).
APPLIED_WITHIN_S = 0.5


async def applied_after(js: object, settings: Settings, db_url: str, key: str, due: str) -> float:
    """Seconds from a ScheduleTimer's publish to its row in Postgres."""
    sent = time.monotonic()
    await publish_raw(
        js, settings, "acme", "schedule", {"tenantId": "acme", "serviceCallId": key, "dueAt": due}
    )
    await until(
        lambda: row(db_url, "acme", key) is not None,
        timeout=30,
        what=f"{key} stored",
    )
    return time.monotonic() - sent


def metadata_changed(config: api.StreamConfig, settings: Settings) -> None:
    config.metadata = {**(config.metadata or {}), "test.updated": "yes"}


def subject_added(config: api.StreamConfig, settings: Settings) -> None:
    config.subjects = [*(config.subjects or []), f"{settings.subject_prefix}.*.timer.later"]


@pytest.mark.parametrize("change", [metadata_changed, subject_added])
async def test_an_update_of_the_command_stream_does_not_stall_intake(
    settings: Settings, db_url: str, change: Callable[[api.StreamConfig, Settings], None]
) -> None:
    async with running_replica(settings), jetstream(settings) as js:
        due = iso_in(3600, db_url)
        before = [await applied_after(js, settings, db_url, f"before-{i}", due) for i in range(5)]
        config = (await js.stream_info(settings.command_stream)).config
        change(config, settings)
        await js.update_stream(config)
        after = [await applied_after(js, settings, db_url, f"after-{i}", due) for i in range(5)]
        assert max(after) < APPLIED_WITHIN_S, f"applied after (s): before {before}, after {after}"
