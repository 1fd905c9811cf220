"""The `timer-service` command's argument types: each raises ArgumentTypeError, which the parser
prints as one line (cli.py)."""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime
from typing import Any

from worker.config import parse_duration
from worker.contract import REASONS, TENANT_RULE, is_valid_tenant

# reads.STATES, without importing the database driver to parse a command line.
STATES = ("Scheduled", "Paused", "Reached", "Cancelled", "Expired")


def duration_arg(value: str) -> str:
    try:
        parse_duration(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def tenant_arg(value: str) -> str:
    if not is_valid_tenant(value):
        raise argparse.ArgumentTypeError(f"not a tenant id: {value!r} (it must match {TENANT_RULE})")
    return value


def count_arg(value: str) -> int:
    if not re.fullmatch(r"[0-9]+", value) or int(value) < 1:
        raise argparse.ArgumentTypeError(f"not a whole number of at least 1: {value!r}")
    return int(value)


def state_arg(value: str) -> str:
    for state in STATES:
        if value.lower() == state.lower():
            return state
    raise argparse.ArgumentTypeError(f"{value!r} is not a state: one of {', '.join(STATES)}")


def reason_arg(value: str) -> str:
    if value not in REASONS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a reason code: one of {', '.join(sorted(REASONS))}"
        )
    return value


def when_arg(value: str) -> datetime:
    """RFC 3339 with an offset, or a duration before (-1h) or after (+5m) now."""
    if value[:1] in ("+", "-"):
        sign = -1 if value[0] == "-" else 1
        try:
            return datetime.now(UTC) + sign * parse_duration(value[1:])
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an RFC 3339 time or a -/+ duration: {value!r}") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{value!r} needs a UTC offset, e.g. 2026-11-22T09:00:00Z")
    return when


def json_arg(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
