"""Paging cursors: the key of a page's last row as opaque text (JSON in URL-safe base64), and back.
A cursor comes back from whoever holds the URL or the command line, so `decode` takes the shape
its listing's key has and refuses anything else in one line, before a statement sees it."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any

# What a key's parts may be: a string Postgres can store, a count (a bigint), a time with its offset.
TEXT, COUNT, TIME = "text", "count", "time"
NOT_A_CURSOR = "not a cursor of this listing"
# The longest cursor read, and the longest string in one: beyond any id a key holds.
MAX_CURSOR_CHARS = 4096
MAX_TEXT_CHARS = 1024
_BIGINT = 2**63 - 1


def encode(key: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


def decode(cursor: str, *kinds: str) -> list[Any]:
    """The key `cursor` holds, one part of each of `kinds` (a TIME as a datetime); ValueError
    saying it is not a cursor of this listing for anything else."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise ValueError(NOT_A_CURSOR)
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error, RecursionError):
        raise ValueError(NOT_A_CURSOR) from None
    if not isinstance(key, list) or len(key) != len(kinds):
        raise ValueError(NOT_A_CURSOR)
    return [_part(value, kind) for value, kind in zip(key, kinds, strict=True)]


def _part(value: object, kind: str) -> Any:
    if kind == COUNT:
        if type(value) is not int or not 0 <= value <= _BIGINT:
            raise ValueError(NOT_A_CURSOR)
        return value
    if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS or "\x00" in value:
        raise ValueError(NOT_A_CURSOR)
    try:
        value.encode()  # a lone surrogate is no text Postgres stores
        when = datetime.fromisoformat(value) if kind == TIME else None
    except ValueError:
        raise ValueError(NOT_A_CURSOR) from None
    if kind == TIME:
        if when is None or when.tzinfo is None:  # compared with the table's times, which carry one
            raise ValueError(NOT_A_CURSOR)
        return when
    return value
