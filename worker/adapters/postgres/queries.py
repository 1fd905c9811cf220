"""The named SQL of sql/queries/ (`-- name: <name>`), loaded once; a `-- fragment: <name>` is
spliced where a statement says `{{<name>}}`."""

from __future__ import annotations

import re
from collections.abc import Iterable
from importlib import resources
from typing import LiteralString

_HEADER = re.compile(r"^-- (name|fragment): (\w+)\s*$", re.MULTILINE)
_USE = re.compile(r"\{\{(\w+)\}\}")


class QueryFileError(ValueError):
    """sql/queries/ holds a name twice, or a statement uses a fragment nobody wrote."""


def parse(texts: Iterable[str]) -> dict[str, LiteralString]:
    """Every named statement of `texts` (the files' contents), fragments spliced in."""
    named: dict[str, str] = {}
    fragments: dict[str, str] = {}
    for text in texts:
        parts = _HEADER.split(text)  # [preamble, kind1, name1, body1, kind2, ...]
        for kind, name, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            into = fragments if kind == "fragment" else named
            if name in named or name in fragments:
                raise QueryFileError(f"sql/queries/: {name} is defined twice")
            into[name] = _strip_description(body) if kind == "fragment" else body.strip()
            if kind == "fragment" and "--" in into[name]:
                raise QueryFileError(
                    f"sql/queries/: fragment {name} holds a comment, which would cut its use short"
                )

    def splice(match: re.Match[str]) -> str:
        if match[1] not in fragments:
            raise QueryFileError(f"sql/queries/: no fragment {match[1]}")
        return fragments[match[1]]

    unused = set(fragments) - {m for body in named.values() for m in _USE.findall(body)}
    if unused:
        raise QueryFileError(f"sql/queries/: fragment {', '.join(sorted(unused))} is used nowhere")
    # The files' own text, so LiteralString for psycopg.
    return {name: _USE.sub(splice, body) for name, body in named.items()}


def _strip_description(body: str) -> str:
    """A fragment's text without its description, which would end mid-expression where it goes."""
    lines = body.strip().splitlines()
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    return "\n".join(lines).strip()


def _load() -> dict[str, LiteralString]:
    folder = resources.files("worker.sql").joinpath("queries")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return parse(f.read_text(encoding="utf-8") for f in files)


QUERIES = _load()
