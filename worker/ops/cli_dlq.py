"""The `timer-service dlq` commands: list, show, replay, purge."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys

from worker.errors import ConfigError
from worker.ops.cli_nats import _nats_options
from worker.ops.cli_output import emit
from worker.settings import load_settings


def cmd_dlq(args: argparse.Namespace) -> int:
    from worker.ops import dlq

    settings = load_settings()
    f = dlq.DlqFilter(
        tenant=getattr(args, "tenant", None),
        reason=getattr(args, "reason", None),
        since=getattr(args, "since", None),
        before=getattr(args, "before", None),
        service_call_id=getattr(args, "id", None),
    )
    body = None
    if getattr(args, "body", None):
        body = sys.stdin.buffer.read() if args.body == "-" else open(args.body, "rb").read()  # noqa: SIM115

    async def act() -> int:
        async with dlq.open_dlq(settings, **_nats_options()) as q:
            if args.dlq_command == "list":
                page = await q.page(f, args.after, args.limit)
                out = {"entries": [e.as_dict(with_body=False) for e in page.entries], "next": page.next_seq}
                print(json.dumps(out, indent=2) if args.json else dlq.render_entries(page))
                return 0
            if args.dlq_command == "show":
                entry = await q.get(args.seq)
                if entry is None:
                    print(f"no DLQ entry {args.seq} (replayed, purged or aged out)", file=sys.stderr)
                    return 1
                print(json.dumps(entry.as_dict(), indent=2) if args.json else dlq.render_entry(entry))
                return 0
            if args.dlq_command == "replay":
                try:
                    done = await q.replay(args.seq, body)
                except dlq.ReplayRefused as exc:
                    raise ConfigError(f"not replayed: {exc}") from None
                if done is None:
                    print(f"no DLQ entry {args.seq}: replayed or purged; nothing sent", file=sys.stderr)
                    return 1
                again = " (the command stream had it already: replayed before)" if done.duplicate else ""
                text = (
                    f"replayed DLQ entry {done.seq} to {done.subject} as command {done.command_seq}"
                    f"{again}; removed from the DLQ"
                )
                emit(args, dataclasses.asdict(done), text)
                return 0
            if not any((f.tenant, f.reason, f.since, f.before, f.service_call_id)):
                raise ConfigError(
                    "dlq purge: give at least one of --tenant, --id, --reason, --since, --before"
                )
            seqs = await q.purge(f, confirmed=args.yes)
            if args.yes:
                text = f"purged {len(seqs)} DLQ entries"
            else:
                text = f"{len(seqs)} DLQ entries match; run again with --yes to delete them"
            emit(args, {"purged" if args.yes else "matching": len(seqs)}, text)
            return 0

    code: int = asyncio.run(act())
    return code
