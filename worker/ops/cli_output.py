"""What the `timer-service` commands print: a line for people, or with `--json` the same answer as
JSON in the contract's camelCase, on stdout either way (the exit code says how it went)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from typing import Any


def emit(args: argparse.Namespace, data: Mapping[str, Any], text: str, *, failed: bool = False) -> None:
    """One command's answer. `failed`: the line goes to stderr (what went wrong, beside a
    non-zero exit); JSON stays on stdout, where a program reading it looks."""
    if getattr(args, "json", False):
        from worker.ops.reads import camel  # the one camelCase of the CLI's JSON (status, list)

        print(json.dumps(camel(dict(data)), indent=2))
    else:
        print(text, file=sys.stderr if failed else sys.stdout)


def quoted(value: str, chars: int = 60) -> str:
    """A value a user gave, quoted in a line that refuses it: its repr, cut at `chars` characters
    (escapes counted: a string of control characters is ten times as long once escaped)."""
    text = repr(value)
    return text if len(text) <= chars else text[: chars - 1] + "…"
