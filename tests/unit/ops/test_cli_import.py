"""`schedule --from-file` and `cancel --from-file` (worker/ops/cli_import.py): the file read a line
at a time, none held past the bound, whatever it holds; each line sent as a replica's check passed
it, or named with why not."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import property_settings
from worker.client.envelopes import Envelope
from worker.contract import CancelTimer, CommandKind, Rejection, Subjects
from worker.core.commands import parse_command
from worker.ops.cli_import import LineForm, _lines
from worker.settings import load_settings

FUZZ = property_settings(300)

LIMIT = 10


class Bounded(io.BytesIO):
    """A file that records the most it was asked to read at once; a read without a bound fails."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.most = 0

    def readline(self, size: int | None = -1, /) -> bytes:
        assert size is not None and size >= 0, "a line read whole, however long"
        self.most = max(self.most, size)
        return super().readline(size)

    def read(self, size: int | None = -1, /) -> bytes:
        assert size is not None and size >= 0, "the file read whole"
        self.most = max(self.most, size)
        return super().read(size)


def test_a_line_past_the_bound_is_skipped_by_its_number_without_being_held() -> None:
    fits = b"x" * LIMIT + b"\n"  # LIMIT bytes and its line end: taken
    over = b"y" * (LIMIT + 1) + b"\n"
    huge = b"z" * (100 * LIMIT) + b"\n"
    stream = Bounded(b'{"a": 1}\n' + fits + over + huge + b"\n" + b"z" * (3 * LIMIT))
    assert list(_lines(stream, LIMIT)) == [
        (1, b'{"a": 1}\n', 9),
        (2, fits, LIMIT + 1),
        (3, None, LIMIT + 2),
        (4, None, 100 * LIMIT + 1),
        (5, b"\n", 1),
        (6, None, 3 * LIMIT),  # the last line, without a line end
    ]
    assert stream.most <= LIMIT + 1


def test_the_last_line_needs_no_line_end() -> None:
    assert list(_lines(Bounded(b"a\nbc"), LIMIT)) == [(1, b"a\n", 2), (2, b"bc", 2)]
    assert list(_lines(Bounded(b""), LIMIT)) == []


# `cancel --from-file`'s lines: a bare serviceCallId of --tenant, or a CancelTimer as JSON.

SUBJECTS = Subjects("svc")
STAMP = 1_700_000_000_000


def form(kind: CommandKind, tenant: str | None = "acme") -> LineForm:
    return LineForm(load_settings(), kind, tenant, STAMP)


def checked(kind: CommandKind, sent: Envelope) -> Any:
    """What a replica makes of what the line sent, on the subject it was sent to."""
    tenant = sent.subject.split(".")[1]
    return parse_command(kind, tenant, sent.body, now=datetime.now(UTC), max_horizon=timedelta(days=3650))


def test_a_bare_service_call_id_is_a_cancel_of_the_tenant_given() -> None:
    made = form("cancel").command(b"sc-1\n", SUBJECTS)
    assert not isinstance(made, str)
    sent, new = made
    assert new and sent.subject == "svc.acme.timer.cancel"
    assert checked("cancel", sent) == CancelTimer("acme", "sc-1", None, STAMP)


def test_a_json_line_names_its_own_tenant() -> None:
    line = json.dumps({"tenantId": "globex", "serviceCallId": "sc 2", "timestampMs": 5}).encode()
    made = form("cancel").command(line, SUBJECTS)
    assert not isinstance(made, str)
    assert made[0].subject == "svc.globex.timer.cancel"
    assert checked("cancel", made[0]) == CancelTimer("globex", "sc 2", None, 5)


@pytest.mark.parametrize(
    ("line", "tenant", "why"),
    [
        (b"sc-1", None, "a bare serviceCallId needs --tenant (or a JSON line with its tenantId)"),
        (b"\xff\xfe", "acme", "bad_service_call_id: not UTF-8"),
        (b'{"serviceCallId": "x"}', "acme", "missing_field: tenantId is required"),
        (b'{"tenantId": "acme"}', "acme", "missing_field: serviceCallId is required"),
        (b"{not json", "acme", "invalid_json: "),
    ],
)
def test_a_line_a_replica_would_reject_is_named_with_why(line: bytes, tenant: str | None, why: str) -> None:
    made = form("cancel", tenant).command(line, SUBJECTS)
    assert isinstance(made, str) and made.startswith(why), made


lines = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=100).map(str.encode),
    st.fixed_dictionaries(
        {},
        optional={
            "tenantId": st.one_of(st.sampled_from(["acme", "a.b", "", "*", ">"]), st.text(max_size=5)),
            "serviceCallId": st.one_of(st.text(max_size=20), st.integers(), st.none()),
            "dueAt": st.sampled_from(["2030-01-01T00:00:00Z", "tomorrow", "9999-12-31T00:00:01Z"]),
            "timestampMs": st.one_of(st.integers(), st.text(max_size=3)),
            "type": st.sampled_from(["CancelTimer", "ScheduleTimer", "Other"]),
            "payload": st.dictionaries(st.sampled_from(["tenantId", "serviceCallId"]), st.text(max_size=5)),
        },
    ).map(lambda d: json.dumps(d).encode()),
)


@FUZZ
@given(line=lines, kind=st.sampled_from(["schedule", "cancel"]), tenant=st.sampled_from([None, "acme"]))
def test_every_line_is_sent_as_a_replica_accepts_it_or_named_never_raised(
    line: bytes, kind: CommandKind, tenant: str | None
) -> None:
    """Whatever a line holds, it is either a command a replica takes as it was sent, on its own
    tenant's subject of the run's kind, or a reason: nothing is lost, nothing raises."""
    made = form(kind, tenant).command(line.replace(b"\n", b" "), SUBJECTS)
    if isinstance(made, str):
        assert made and "\n" not in made
        return
    sent, _ = made
    command = checked(kind, sent)
    assert not isinstance(command, Rejection), command
    assert sent.subject == SUBJECTS.of(command.tenant_id, kind)
