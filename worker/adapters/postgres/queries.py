"""The named SQL of sql/queries.sql, loaded once: no SQL text is scattered through the code."""

from __future__ import annotations

import re
from importlib import resources
from typing import LiteralString, cast

_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def _load() -> dict[str, LiteralString]:
    text = resources.files("worker.sql").joinpath("queries.sql").read_text(encoding="utf-8")
    parts = _HEADER.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    return {
        name: cast(LiteralString, body.strip()) for name, body in zip(parts[1::2], parts[2::2], strict=True)
    }


QUERIES = _load()
