"""The tenants listing's checks (worker/ops/tenants.py): a prefix is a tenant id's start, a cursor
one of the sort asked for; anything else one bounded line, before any query."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.contract import is_valid_tenant
from worker.ops import tenants
from worker.ops.cursors import encode as _encode


@given(st.text(max_size=200))
def test_a_prefix_is_the_start_of_a_tenant_id_or_one_line(prefix: str) -> None:
    try:
        tenants.check_prefix(prefix)
    except ValueError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 200
        assert prefix and not is_valid_tenant(prefix)
        return
    assert prefix == "" or is_valid_tenant(prefix)


class NoQuery:
    def cursor(self, **_: Any) -> Any:
        raise AssertionError("a bad request reached the database")


@pytest.mark.parametrize(
    ("sort", "after"),
    [("name", _encode([1, "acme"])), ("pending", _encode(["acme"])), ("pending", _encode([True, "x"])),
     ("name", "%%%"), ("name", _encode({"a": 1})), ("size", None)],
)  # fmt: skip
def test_a_cursor_of_another_sort_or_none_at_all_is_refused_before_any_query(
    sort: str, after: str | None
) -> None:
    with pytest.raises(ValueError, match=r"cursor|sort"):
        tenants.tenants_page(NoQuery(), sort, "", after)  # type: ignore[arg-type]
