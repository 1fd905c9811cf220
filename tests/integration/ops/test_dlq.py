"""The DLQ for operators: list, show, replay (unchanged or edited, once) and purge, on real NATS."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.helpers import consumer_idle, iso_in, jetstream, publish_raw, row, running_replica, until
from tests.integration.ops.test_cli import run
from worker.config import Settings
from worker.ops import dlq


def _env(settings: Settings) -> dict[str, str]:
    names = ("database_url", "nats_url", "subject_prefix", "command_stream", "event_stream", "dlq_stream")
    env = {f"TIMER_{n.upper()}": str(getattr(settings, n)) for n in names}
    env["TIMER_DATABASE_URL"] = settings.database_url.get_secret_value()
    return env


async def _rejected(settings: Settings, commands: list[tuple[str, str, Any]]) -> list[dlq.DlqEntry]:
    """Send bad commands to a running replica; the DLQ entries they became, oldest first."""
    async with jetstream(settings) as js:
        for tenant, kind, body in commands:
            await publish_raw(js, settings, tenant, kind, body)
    async with dlq.open_dlq(settings) as q:

        async def stored() -> bool:
            return len((await q.page(dlq.DlqFilter())).entries) == len(commands)

        await until(stored, what="DLQ copies")
        return (await q.page(dlq.DlqFilter())).entries


def _schedule(tenant: str, sid: str, due_at: str) -> dict[str, str]:
    return {"tenantId": tenant, "serviceCallId": sid, "dueAt": due_at}


async def test_list_filters_by_tenant_reason_and_time(settings: Settings) -> None:
    async with running_replica(settings):
        entries = await _rejected(
            settings,
            [
                ("acme", "schedule", _schedule("acme", "a1", "2030-01-01 09:00")),
                ("acme", "schedule", b"not json"),
                ("zeta", "schedule", _schedule("zeta", "z1", "tomorrow")),
            ],
        )
    assert [(e.tenant, e.reason) for e in entries] == [
        ("acme", "bad_due_at"),
        ("acme", "invalid_json"),
        ("zeta", "bad_due_at"),
    ]
    async with dlq.open_dlq(settings) as q:
        acme = await q.page(dlq.DlqFilter(tenant="acme"))
        assert [e.seq for e in acme.entries] == [entries[0].seq, entries[1].seq]
        bad_due = await q.page(dlq.DlqFilter(reason="bad_due_at"), limit=1)
        assert [e.tenant for e in bad_due.entries] == ["acme"] and bad_due.next_seq == entries[0].seq
        rest = await q.page(dlq.DlqFilter(reason="bad_due_at"), after=bad_due.next_seq)
        assert [e.tenant for e in rest.entries] == ["zeta"] and rest.next_seq is None
        assert entries[2].time is not None
        assert (await q.page(dlq.DlqFilter(before=entries[0].time))).entries == []
        shown = await q.get(entries[1].seq)
        assert shown is not None and shown.body == b"not json"
        assert shown.original_subject == f"{settings.subject_prefix}.acme.timer.schedule"
        assert shown.headers["Timer-Error"] == "invalid_json"


async def test_replay_of_an_edited_command_schedules_it_once_and_empties_the_dlq(
    settings: Settings, db_url: str
) -> None:
    async with running_replica(settings):
        (entry,) = await _rejected(settings, [("acme", "schedule", _schedule("acme", "fixme", "soon"))])
        fixed = json.dumps(_schedule("acme", "fixme", iso_in(3600, db_url))).encode()
        async with dlq.open_dlq(settings) as q:
            with pytest.raises(dlq.ReplayRefused, match="bad_due_at"):
                await q.replay(entry.seq)  # as it is, it would only come back
            with pytest.raises(dlq.ReplayRefused, match="tenant_mismatch"):
                await q.replay(entry.seq, json.dumps(_schedule("other", "fixme", iso_in(60))).encode())
            assert await q.get(entry.seq) is not None, "a refused replay keeps the entry"

            done = await q.replay(entry.seq, fixed)
            assert done is not None and not done.duplicate
            assert done.subject == f"{settings.subject_prefix}.acme.timer.schedule"
            await until(lambda: row(db_url, "acme", "fixme") is not None, what="the replayed timer")
            assert await q.get(entry.seq) is None
            assert await q.replay(entry.seq, fixed) is None, "a second run sends nothing"


async def test_a_replay_interrupted_before_the_delete_is_not_submitted_twice(settings: Settings) -> None:
    """The crash window: the command stream stored the replay, the DLQ entry was not deleted yet.
    Running replay again is dropped by the command stream (same Nats-Msg-Id) and then deletes."""
    body = _schedule("acme", "q1", iso_in(3600))
    await _quota_entry(settings, body)
    async with dlq.open_dlq(settings) as q:
        (entry,) = (await q.page(dlq.DlqFilter())).entries
        ack = await q.js.publish(
            entry.original_subject, entry.body, headers={"Nats-Msg-Id": await q.replay_id(entry)}
        )
        done = await q.replay(entry.seq)
        assert done is not None and done.duplicate and done.command_seq == ack.seq, (done, ack)
        info = await q.js.stream_info(settings.command_stream)
        # Nothing stored after the first copy (the stream keeps applied commands until a replica
        # purges them, so it is the last sequence that tells, not the count).
        assert info.state.last_seq == ack.seq, "one copy of the command, not two"
        assert await q.get(entry.seq) is None


async def _quota_entry(settings: Settings, body: dict[str, str]) -> None:
    """A valid command in the DLQ (over its tenant's quota), with no replica to apply its replay."""
    async with running_replica(settings, tenant_max_pending=1):
        async with jetstream(settings) as js:
            await publish_raw(js, settings, "acme", "schedule", _schedule("acme", "first", iso_in(3600)))
            await publish_raw(js, settings, "acme", "schedule", body)
        async with dlq.open_dlq(settings) as q:

            async def stored() -> bool:
                return len((await q.page(dlq.DlqFilter(reason="quota_exceeded"))).entries) == 1

            await until(stored, what="the quota rejection")


async def test_cli_show_replay_and_purge(settings: Settings, db_url: str) -> None:
    env = _env(settings)
    async with running_replica(settings):
        entries = await _rejected(
            settings,
            [
                ("acme", "schedule", _schedule("acme", "c1", "later")),
                ("acme", "cancel", b"{}"),
                ("zeta", "schedule", b"[]"),
            ],
        )
        listed = await asyncio.to_thread(run, "dlq", "list", "--tenant", "acme", "--json", **env)
        assert [e["seq"] for e in json.loads(listed.stdout)["entries"]] == [entries[0].seq, entries[1].seq]
        shown = await asyncio.to_thread(run, "dlq", "show", str(entries[0].seq), **env)
        assert "Timer-Error: bad_due_at" in shown.stdout and '"serviceCallId": "c1"' in shown.stdout

        refused = await asyncio.to_thread(run, "dlq", "replay", str(entries[0].seq), **env)
        assert refused.returncode == 2 and "would be rejected again: bad_due_at" in refused.stderr
        fixed = json.dumps(_schedule("acme", "c1", iso_in(3600, db_url)))
        replay = ("dlq", "replay", str(entries[0].seq), "--body", "-")
        done = await asyncio.to_thread(lambda: run(*replay, stdin=fixed, **env))
        assert done.returncode == 0 and "removed from the DLQ" in done.stdout, done.stderr
        await until(lambda: row(db_url, "acme", "c1") is not None, what="the replayed timer")
        again = await asyncio.to_thread(lambda: run(*replay, stdin=fixed, **env))
        assert again.returncode == 1 and "nothing sent" in again.stderr

    counted = run("dlq", "purge", "--tenant", "acme", **env)
    assert counted.stdout.strip() == "1 DLQ entries match; run again with --yes to delete them"
    assert run("dlq", "purge", **env).returncode == 2, "a purge needs a filter"
    purged = run("dlq", "purge", "--tenant", "acme", "--yes", **env)
    assert purged.stdout.strip() == "purged 1 DLQ entries"
    left = json.loads(run("dlq", "list", "--json", **env).stdout)["entries"]
    assert [e["tenant"] for e in left] == ["zeta"]


# --- issue 19: a DLQ entry is no way into another tenant, and stays unique -------------------------


async def test_a_forged_dlq_entry_is_never_replayed_to_another_tenant(
    settings: Settings, db_url: str
) -> None:
    """Defect 2: mallory, allowed to publish on its own subjects, adds an entry to its own dlq
    subject naming the victim's cancel subject (or carrying the victim's body), and waits for an
    operator to replay it. The replay is refused, by the CLI and the API the console calls."""
    env = _env(settings)
    p = settings.subject_prefix
    victim_body = json.dumps({"tenantId": "victim", "serviceCallId": "sc-1"}).encode()
    async with running_replica(settings):
        async with jetstream(settings) as js:
            await publish_raw(
                js, settings, "victim", "schedule", _schedule("victim", "sc-1", iso_in(3600, db_url))
            )
            await until(lambda: row(db_url, "victim", "sc-1") is not None, what="the victim's timer")
            forged = {"Timer-Error": "quota_exceeded", "Timer-Error-Detail": "over quota"}
            across = await js.publish(
                f"{p}.mallory.timer.dlq",
                victim_body,
                headers=forged | {"Timer-Subject": f"{p}.victim.timer.cancel"},
            )
            own_subject = await js.publish(
                f"{p}.mallory.timer.dlq",
                victim_body,
                headers=forged | {"Timer-Subject": f"{p}.mallory.timer.cancel"},
            )
        refused = await asyncio.to_thread(run, "dlq", "replay", str(across.seq), **env)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "only goes to the entry's own tenant" in refused.stderr
        async with dlq.open_dlq(settings) as q:
            with pytest.raises(dlq.ReplayRefused, match="own tenant"):
                await q.replay(across.seq)
            with pytest.raises(dlq.ReplayRefused, match="tenant_mismatch"):
                await q.replay(own_subject.seq)  # the body's tenant is checked too
            assert await q.get(across.seq) is not None and await q.get(own_subject.seq) is not None
            info = await q.js.stream_info(settings.command_stream)
        assert info.state.last_seq == 1, "nothing but the victim's own schedule reached the command stream"
        await until(lambda: consumer_idle(settings), what="the schedule applied")
    victim = row(db_url, "victim", "sc-1")
    assert victim is not None and victim["state"] == "Scheduled"


async def _streams_back(settings: Settings, *names: str) -> None:
    """With no replica running, delete these streams; the next replica makes them anew."""
    async with jetstream(settings) as js:
        for name in names:
            await js.delete_stream(name)


async def test_rejected_commands_keep_their_dlq_copy_after_the_command_stream_is_recreated(
    settings: Settings,
) -> None:
    """Defect 3: a recreated command stream numbers from 1 again. Each rejected command still gets
    its copy (it was dropped as a duplicate of the old stream's copy, and the command acknowledged)."""
    bad = [("acme", "schedule", f"not json {i}".encode()) for i in range(10)]
    async with running_replica(settings):
        before = await _rejected(settings, bad)
    await _streams_back(settings, settings.command_stream)
    async with running_replica(settings):
        async with jetstream(settings) as js:
            for tenant, kind, body in bad:
                await publish_raw(js, settings, tenant, kind, body)
            assert (await js.stream_info(settings.command_stream)).state.last_seq == 10, (
                "numbered from 1 again"
            )
        await until(
            lambda: consumer_idle(settings), what="every command handled"
        )  # the signal: all acknowledged
    async with dlq.open_dlq(settings) as q:
        after = (await q.page(dlq.DlqFilter(), limit=100)).entries
    assert len(before) == 10
    assert [e.body for e in after] == [body for _, _, body in bad] * 2, "every copy, twice over"


async def test_replays_from_a_recreated_dlq_stream_are_not_taken_for_earlier_ones(
    settings: Settings, db_url: str
) -> None:
    """Defect 3, replays: the recreated DLQ stream's entry 1 is replayed as a new command, not
    dropped as a duplicate of the old entry 1's replay (and deleted: a command lost)."""
    fixed = {sid: json.dumps(_schedule("acme", sid, iso_in(3600, db_url))).encode() for sid in ("r1", "r2")}
    async with running_replica(settings):
        (first,) = await _rejected(settings, [("acme", "schedule", _schedule("acme", "r1", "soon"))])
        async with dlq.open_dlq(settings) as q:
            done = await q.replay(first.seq, fixed["r1"])
            assert done is not None and not done.duplicate
    await _streams_back(settings, settings.dlq_stream)
    async with running_replica(settings):
        (second,) = await _rejected(settings, [("acme", "schedule", _schedule("acme", "r2", "soon"))])
        assert second.seq == first.seq, "the recreated stream numbers from 1 again"
        async with dlq.open_dlq(settings) as q:
            again = await q.replay(second.seq, fixed["r2"])
        assert again is not None and not again.duplicate, "a new replay, not the old one"
        await until(lambda: row(db_url, "acme", "r2") is not None, what="the second replayed timer")
        assert row(db_url, "acme", "r1") is not None


async def test_list_names_the_service_call_id_and_filters_by_it(settings: Settings) -> None:
    async with running_replica(settings):
        entries = await _rejected(
            settings,
            [
                ("acme", "schedule", _schedule("acme", "wanted", "soon")),
                ("acme", "schedule", _schedule("acme", "other", "later")),
            ],
        )
    env = _env(settings)
    listed = await asyncio.to_thread(run, "dlq", "list", "--id", "wanted", "--json", **env)
    found = json.loads(listed.stdout)["entries"]
    assert [(e["seq"], e["serviceCallId"]) for e in found] == [(entries[0].seq, "wanted")], listed.stderr
    assert found[0]["time"].endswith("Z")
    table = await asyncio.to_thread(run, "dlq", "list", "--tenant", "acme", **env)
    assert "SERVICE CALL ID" in table.stdout and " other " in table.stdout, table.stdout


async def test_listing_reads_in_batches_and_leaves_no_consumer(settings: Settings) -> None:
    """More entries than one batch, paged, in order; the listing's own consumer is gone after."""
    async with jetstream(settings) as js:
        await js.add_stream(name=settings.dlq_stream, subjects=[f"{settings.subject_prefix}.*.timer.dlq"])
        for i in range(dlq.SCAN_BATCH + 44):
            tenant = "acme" if i % 2 else "zeta"
            await js.publish(
                f"{settings.subject_prefix}.{tenant}.timer.dlq",
                b"{}",
                headers={"Timer-Error": "invalid_json"},
            )
        async with dlq.open_dlq(settings) as q:
            everything = await q.page(dlq.DlqFilter(), limit=1000)
            assert [e.seq for e in everything.entries] == list(range(1, dlq.SCAN_BATCH + 45))
            first = await q.page(dlq.DlqFilter(tenant="acme"), limit=100)
            rest = await q.page(dlq.DlqFilter(tenant="acme"), after=first.next_seq or 0, limit=1000)
            assert [e.seq for e in first.entries + rest.entries] == list(range(2, dlq.SCAN_BATCH + 45, 2))
        assert (await js.stream_info(settings.dlq_stream)).state.consumer_count == 0
