"""The console's JSON API (worker/ops/console/api.py): every page's data, read-only, behind the same
door and roles as the pages, in the shapes the CLI's --json prints; docs/OPERATIONS.md's curl runs
as written."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.helpers import query, settings_env
from tests.integration.ops.test_cli import run
from tests.integration.ops.test_console import TOKEN, _reject, console_settings
from tests.integration.ops.test_console_browser import console
from tests.integration.ops.test_console_tenants import _seed
from worker.config import Settings
from worker.ops.console.app import create_app

BEARER = {"Authorization": f"Bearer {TOKEN}"}
DOCS = Path(__file__).parents[3] / "docs" / "OPERATIONS.md"
PATHS = [
    "/api/v1/overview",
    "/api/v1/tenants",
    "/api/v1/tenants/acme",
    "/api/v1/timers?tenant=acme",
    "/api/v1/timers/acme/sc-1",
    "/api/v1/dlq",
    "/api/v1/dlq/1",
]


@pytest.fixture
def client(settings: Settings, db_url: str) -> Iterator[TestClient]:
    _seed(db_url, {"acme": 3, "globex": 1, "initech": 1})
    query(
        db_url,
        "UPDATE timers SET correlation_id = 'order-9', labels = '{\"team\": \"red\"}' "
        "WHERE service_call_id = 'sc-1'",
    )
    _reject(settings, "acme", ["broken-1"])
    # A reader: operators are named, and the token's holder is not one of them.
    reader = console_settings(settings, console_actions=True, console_operators="alice")
    with TestClient(create_app(reader), follow_redirects=False) as c:
        yield c


def _keys(value: Any, skip: frozenset[str] = frozenset({"headers", "labels", "counts"})) -> set[str]:
    """Every dict key in `value`, not under `skip` (maps whose keys are data, not names)."""
    if isinstance(value, dict):
        return {k for k in value} | {x for k, v in value.items() if k not in skip for x in _keys(v, skip)}
    if isinstance(value, list):
        return {x for v in value for x in _keys(v, skip)}
    return set()


def test_every_path_needs_credentials_and_answers_401_not_the_login_form(client: TestClient) -> None:
    for path in PATHS:
        refused = client.get(path)
        assert refused.status_code == 401 and refused.content == b"", path
        wrong = client.get(path, headers={"Authorization": "Bearer wrong-token-123456"})
        assert wrong.status_code == 401 and b"acme" not in wrong.content, path


def test_a_reader_reads_every_page_as_json_and_writes_nothing(client: TestClient) -> None:
    for path in PATHS:
        answer = client.get(path, headers=BEARER)
        assert answer.status_code == 200, (path, answer.text)
        assert answer.headers["content-type"] == "application/json"
        assert answer.headers["cache-control"] == "no-store"
        assert not [k for k in _keys(answer.json()) if "_" in k], (path, answer.json())
        assert client.post(path, headers=BEARER).status_code == 405, path


def test_the_answers_are_the_clis_json(client: TestClient, settings: Settings, db_url: str) -> None:
    env = settings_env(settings)

    def cli(*args: str) -> Any:
        done = run(*args, "--json", **env)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert client.get("/api/v1/tenants/acme", headers=BEARER).json() == cli("status", "--tenant", "acme")
    api, by_cli = (
        client.get("/api/v1/timers/acme/sc-1", headers=BEARER).json(),
        cli("describe", "--tenant", "acme", "--id", "sc-1"),
    )
    # `why` counts down to dueAt from the moment of each read ("due in 60.0m", then "59.9m").
    assert api.pop("why").startswith("waiting: due in") and by_cli.pop("why").startswith("waiting: due in")
    assert api == by_cli
    listed = client.get("/api/v1/timers?tenant=acme&limit=2", headers=BEARER).json()
    by_cli = cli("list", "--tenant", "acme", "--limit", "2")
    assert listed["timers"] == by_cli["timers"] and listed["next"] is not None and listed["prev"] is None
    rest = client.get(f"/api/v1/timers?tenant=acme&after={listed['next']}", headers=BEARER).json()
    assert [t["serviceCallId"] for t in rest["timers"]] == ["sc-3"]
    labelled = client.get("/api/v1/timers?tenant=acme&label=team=red", headers=BEARER).json()
    assert [t["serviceCallId"] for t in labelled["timers"]] == ["sc-1"]
    assert client.get("/api/v1/dlq?tenant=acme", headers=BEARER).json() == cli(
        "dlq", "list", "--tenant", "acme"
    )
    seq = client.get("/api/v1/dlq", headers=BEARER).json()["entries"][0]["seq"]
    assert client.get(f"/api/v1/dlq/{seq}", headers=BEARER).json() == cli("dlq", "show", str(seq))
    overview = client.get("/api/v1/overview", headers=BEARER).json()
    status = cli("status")
    assert {k: overview[k] for k in status if k != "commands"} == {
        k: v for k, v in status.items() if k != "commands"
    }
    assert overview["tenantCount"] == 3 and overview["counts"]["Scheduled"] == 5
    assert {"countedAgoS", "replicas", "lateness", "commands"} <= overview.keys()


@pytest.mark.parametrize(
    ("path", "status", "said"),
    [
        ("/api/v1/timers/acme/nope", 404, "no such timer"),
        ("/api/v1/dlq/999999", 404, "no DLQ entry 999999"),
        ("/api/v1/tenants/%3Cb%3E", 400, "not a tenant id"),
        ("/api/v1/timers", 400, "tenant: give one tenant id"),
        ("/api/v1/timers?tenant=acme&state=Gone", 400, "bad filter"),
        ("/api/v1/timers?tenant=acme&after=%00%01", 400, "not a cursor"),
        ("/api/v1/timers?tenant=acme&limit=-1", 400, "limit: a whole number"),
        ("/api/v1/tenants?limit=" + "9" * 50, 400, "limit: a whole number"),
        ("/api/v1/tenants?prefix=%E2%98%83", 400, "a tenant prefix"),
        ("/api/v1/dlq?from=soon", 400, "from: not a time"),
    ],
)
def test_bad_input_is_one_line_of_json(client: TestClient, path: str, status: int, said: str) -> None:
    answer = client.get(path, headers=BEARER)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert said in error and "\n" not in error and len(error) < 400, error


async def test_the_documented_curl_runs_as_written(settings: Settings, db_url: str) -> None:
    text = DOCS.read_text(encoding="utf-8").split("### The console's JSON API")[1].split("\n## ")[0]
    (line,) = re.findall(r"^```sh\n(curl .*)\n```$", text, re.M)
    (shown,) = re.findall(r"^```json\n(.*)\n```$", text, re.M)
    _seed(db_url, {"acme": 3, "globex": 1, "initech": 1})
    async with console(settings) as base:
        env = {**os.environ, "CONSOLE": base, "TIMER_CONSOLE_TOKEN": TOKEN}
        shell = ["sh", "-c", line]
        done = await asyncio.to_thread(
            subprocess.run, shell, env=env, capture_output=True, text=True, timeout=30
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == json.loads(shown)
