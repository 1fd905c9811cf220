"""The `timer-service` commands on timers (worker/ops/cli_timers.py) without servers."""

from __future__ import annotations

import pytest


def test_a_read_the_service_refuses_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status --id` when a replica answers with an error: the reason on one line, exit 1."""
    from worker.client.errors import GetRefused
    from worker.ops import cli, cli_timers

    def refused(*_: object) -> object:
        raise GetRefused("bad_request", "the request cannot be looked up")

    monkeypatch.setattr(cli_timers, "load_settings", lambda: None)
    monkeypatch.setattr(cli_timers, "_with_client", refused)
    assert cli.main(["status", "--tenant", "acme", "--id", "x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("timer-service: ") and "bad_request" in err, err


def test_list_takes_every_state_the_reads_know() -> None:
    """`list --state` (cli.STATES, kept apart so the parser imports no driver) refused Paused."""
    from worker.ops import cli, reads

    assert cli.STATES == reads.STATES


def test_describe_writes_every_value_as_its_json_form() -> None:
    """`describe` wrote booleans as Python's `False` beside JSON's `false` in a nested value."""
    from worker.ops.reads import one_timer

    view = {"tenantId": "acme", "overdue": False, "paused": True, "attempts": 0, "lastError": None}
    view["repeat"] = {"every": "PT1H", "times": None}
    lines = dict(line.split(None, 1) for line in one_timer(view).splitlines())
    assert lines == {
        "tenantId": "acme",
        "overdue": "false",
        "paused": "true",
        "attempts": "0",
        "repeat": '{"every": "PT1H", "times": null}',
    }
