"""Secure by configuration: real TLS to NATS and Postgres with certificates made here, clear
one-line errors when the other side cannot be trusted, and secrets that never reach a log line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import nats
import nkeys  # type: ignore[import-untyped]
import psycopg
import pytest
from nats.js import api
from prometheus_client import REGISTRY
from pydantic import SecretStr

from tests.certs import SERVER_NAME, Pki, make_pki
from tests.helpers import jetstream, publish_raw, query, row, running_replica, settings_env, until
from tests.servers import admin
from worker import logs
from worker.adapters.jetstream.broker import Broker
from worker.adapters.jetstream.options import connect_options
from worker.client import TimerClient
from worker.client.pulls import PULL_BATCH
from worker.client.wire import nats_connect
from worker.config import Settings, mask_url, secret_values
from worker.devkit.embedded import EmbeddedNats, EmbeddedPostgres, postgres_bin
from worker.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]


def ssl_postgres_bin() -> Path:
    """A Postgres build with SSL: the wheel's has none, so Debian's (`make test` installs it)."""
    candidates = [postgres_bin(), *sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)]
    if found := shutil.which("pg_config"):
        bindir = subprocess.run([found, "--bindir"], capture_output=True, text=True, check=False).stdout
        candidates.append(Path(bindir.strip()))
    for bin_dir in candidates:
        server = bin_dir / "postgres"
        if server.exists() and (bin_dir / "initdb").exists():
            linked = subprocess.run(["ldd", str(server)], capture_output=True, text=True, check=False).stdout
            if "libssl" in linked:
                return bin_dir
    raise AssertionError("no Postgres server built with SSL: `apt-get install postgresql` (make test does)")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_pg(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EmbeddedPostgres]:
    """Postgres with SSL on, asking clients for a certificate signed by the test CA."""
    base = tmp_path_factory.mktemp("tls-pg")
    server = EmbeddedPostgres(
        base, ssl_cert=pki.server_cert, ssl_key=pki.server_key, ssl_ca=pki.ca, bin_dir=ssl_postgres_bin()
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def tls_nats(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[EmbeddedNats]:
    """NATS that speaks TLS only and requires a client certificate signed by the test CA."""
    tls = f"""
tls {{
  cert_file: {json.dumps(str(pki.server_cert))}
  key_file: {json.dumps(str(pki.server_key))}
  ca_file: {json.dumps(str(pki.ca))}
  verify: true
  timeout: 5
}}"""
    with EmbeddedNats(tmp_path_factory.mktemp("tls-nats"), extra_config=tls) as server:
        yield server


def tls_dsn(pg: EmbeddedPostgres, pki: Pki, dbname: str, ca: Path | None = None) -> str:
    ca = ca or pki.ca
    return (
        f"{pg.url_for(dbname)}?sslmode=verify-full&sslrootcert={ca}"
        f"&sslcert={pki.client_cert}&sslkey={pki.client_key}"
    )


def tls_nats_settings(server: EmbeddedNats, pki: Pki) -> dict[str, Any]:
    return {
        "nats_url": f"tls://127.0.0.1:{server.port}",
        "nats_tls_ca": str(pki.ca),
        "nats_tls_cert": str(pki.client_cert),
        "nats_tls_key": str(pki.client_key),
        "nats_tls_server_name": SERVER_NAME,  # not the URL's host: the setting is what is checked
    }


def monitor(server: EmbeddedNats, path: str) -> Any:
    with urllib.request.urlopen(f"{server.monitor_url}{path}", timeout=5) as resp:
        return json.load(resp)


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TIMER_")}
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        env=clean | env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


# --- TLS, for real --------------------------------------------------------------------------------


async def test_a_replica_fires_a_timer_over_tls_to_nats_and_postgres(
    settings: Settings, pki: Pki, tls_pg: EmbeddedPostgres, tls_nats: EmbeddedNats
) -> None:
    dbname = f"tls_{secrets.token_hex(4)}"
    admin(tls_pg.url, "CREATE DATABASE {}", dbname)
    dsn = tls_dsn(tls_pg, pki, dbname)
    over_tls = settings.model_copy(
        update={
            "database_url": SecretStr(dsn),
            "worker_id": "tls-replica",
            **tls_nats_settings(tls_nats, pki),
        }
    )
    opts = connect_options(over_tls)
    async with (
        running_replica(over_tls),
        await TimerClient.connect(opts.pop("servers"), over_tls.subject_prefix, **opts) as client,
    ):
        subject = f"{over_tls.subject_prefix}.acme.timer.due"
        events = await client.js.subscribe(subject, stream=over_tls.event_stream)
        await client.schedule("acme", "over-tls", datetime.now(UTC) + timedelta(seconds=0.5))
        event = json.loads((await events.next_msg(timeout=20)).data)
        assert (event["tenantId"], event["payload"]["serviceCallId"]) == ("acme", "over-tls")

        def reached() -> bool:
            with psycopg.connect(dsn, autocommit=True) as conn:
                row = conn.execute("SELECT state FROM timers WHERE service_call_id = 'over-tls'").fetchone()
            return row is not None and row[0] == "Reached"

        await until(reached, what="the timer recorded Reached over TLS")

        # Postgres says the replica's own connections are encrypted and carry its client certificate.
        with psycopg.connect(dsn, autocommit=True) as conn:
            sessions = conn.execute(
                "SELECT s.ssl, s.version, s.client_dn FROM pg_stat_ssl s"
                " JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'tls-replica'"
            ).fetchall()
        assert sessions and all(ssl and version.startswith("TLS") for ssl, version, _ in sessions), sessions
        assert {dn for _, _, dn in sessions} == {"/CN=timer-service"}
        # NATS says the replica's connection is TLS (and it requires a client certificate, `verify`).
        connz = await asyncio.to_thread(monitor, tls_nats, "/connz")
        replica_conns = [c for c in connz["connections"] if c.get("name") == "tls-replica"]
        assert replica_conns and all(c.get("tls_version", "").startswith("1.") for c in replica_conns)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"TIMER_NATS_TLS_CA": "other_ca"}, "certificate verify failed"),
        ({"TIMER_NATS_TLS_SERVER_NAME": "wrong.example"}, "Hostname mismatch"),
        # TLS 1.3: the server refuses after the handshake, so the client sees the alert or only the
        # reset ("certificate required", "Connection lost", "Broken pipe"): one line, whichever.
        ({"TIMER_NATS_TLS_CERT": None, "TIMER_NATS_TLS_KEY": None}, ""),
    ],
    ids=["wrong-ca", "wrong-server-name", "no-client-certificate"],
)
def test_nats_that_cannot_be_trusted_is_one_clear_line(
    pki: Pki, tls_nats: EmbeddedNats, change: dict[str, str | None], says: str
) -> None:
    env = {f"TIMER_{k.upper()}": v for k, v in tls_nats_settings(tls_nats, pki).items()}
    for key, value in change.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = str(pki.other_ca) if value == "other_ca" else value
    result = cli("schedule", "--tenant", "acme", "--id", "x", "--due-in", "1h", env=env)
    assert result.returncode == 1
    assert re.search(says, one_line(result))


async def test_the_cli_schedules_over_mutual_tls_and_prints_nothing_else(
    settings: Settings, pki: Pki, tls_nats: EmbeddedNats
) -> None:
    over_tls = settings.model_copy(update=tls_nats_settings(tls_nats, pki))
    broker = Broker(over_tls)
    await broker.connect()
    try:
        await broker.ensure_streams()
        env = {f"TIMER_{k.upper()}": str(v) for k, v in tls_nats_settings(tls_nats, pki).items()}
        env["TIMER_SUBJECT_PREFIX"] = over_tls.subject_prefix
        args = ("schedule", "--tenant", "acme", "--id", "by-cli", "--due-in", "1h")
        result = await asyncio.to_thread(cli, *args, env=env)
        assert (result.returncode, result.stderr) == (0, "")
        stream = await broker.js.stream_info(over_tls.command_stream)
        assert stream.state.messages == 1
    finally:
        await broker.close()


@pytest.mark.parametrize("tls", ["ca", "scheme"])
def test_with_tls_configured_a_plaintext_nats_is_refused(pki: Pki, nats_url: str, tls: str) -> None:
    """nats-py on its own would send CONNECT, password included, in clear to a server that does not
    demand TLS (or to a man in the middle that says so)."""
    env = {"TIMER_NATS_USER": "timer", "TIMER_NATS_PASSWORD": NATS_PASSWORD}
    if tls == "ca":
        env |= {"TIMER_NATS_URL": nats_url, "TIMER_NATS_TLS_CA": str(pki.ca)}
    else:
        env |= {"TIMER_NATS_URL": nats_url.replace("nats://", "tls://")}
    result = cli("schedule", "--tenant", "acme", "--id", "x", "--due-in", "1h", env=env)
    assert result.returncode == 1
    assert "TLS is configured but the server does not require it" in one_line(result)


def test_postgres_that_cannot_be_trusted_is_one_clear_line(
    pki: Pki, tls_pg: EmbeddedPostgres, pg_server_url: str
) -> None:
    wrong_ca = cli("migrate", env={"TIMER_DATABASE_URL": tls_dsn(tls_pg, pki, "postgres", pki.other_ca)})
    assert wrong_ca.returncode == 1 and "certificate verify failed" in one_line(wrong_ca)
    no_ca = tls_dsn(tls_pg, pki, "postgres", Path("/nonexistent/ca.crt"))
    missing = cli("status", env={"TIMER_DATABASE_URL": no_ca})
    assert missing.returncode == 1 and '"/nonexistent/ca.crt" does not exist' in one_line(missing)
    # sslmode=require against a server without TLS: refused, never a silent plaintext session.
    plain = cli("status", env={"TIMER_DATABASE_URL": f"{pg_server_url}?sslmode=require"})
    assert plain.returncode == 1 and "SSL" in one_line(plain)


def test_a_missing_tls_or_creds_file_names_its_setting(pki: Pki) -> None:
    for name in ("TIMER_NATS_TLS_CA", "TIMER_NATS_CREDS"):
        result = cli("schedule", "--tenant", "a", "--id", "b", "--due-in", "1s", env={name: "/nonexistent/x"})
        assert result.returncode == 2
        assert one_line(result) == f"timer-service: {name}: cannot read /nonexistent/x"
    half = cli("run", env={"TIMER_NATS_TLS_CERT": str(pki.client_cert)})
    assert half.returncode == 2 and "TIMER_NATS_TLS_CERT" in one_line(half)


# --- credentials, for real ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server_auth", "client"),
    [
        (
            'authorization {{ user: timer, password: "{password}" }}',
            {"nats_user": "timer", "nats_password": "{password}"},
        ),
        ('authorization {{ token: "{password}" }}', {"nats_token": "{password}"}),
        ('authorization {{ users: [ {{ nkey: "{public}" }} ] }}', {"nats_nkey_seed": "{seed}"}),
    ],
    ids=["user-password", "token", "nkey"],
)
async def test_each_nats_credential_setting_authenticates(
    settings: Settings, tmp_path: Path, server_auth: str, client: dict[str, str]
) -> None:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    values = {
        "password": secrets.token_hex(8),
        "seed": seed.decode(),
        "public": nkeys.from_seed(seed).public_key.decode(),
    }
    with EmbeddedNats(tmp_path / "nats", extra_config=server_auth.format(**values)) as server:
        creds = {k: SecretStr(v.format(**values)) if k != "nats_user" else v for k, v in client.items()}
        s = settings.model_copy(update={"nats_url": server.url, **creds})
        broker = Broker(s)
        await broker.connect()
        try:
            await broker.ensure_streams()  # what a replica does first: JetStream answers this user
            assert broker.connected
        finally:
            await broker.close()
        # Without the credential the server refuses: the setting is what let the replica in.
        anonymous = settings.model_copy(update={"nats_url": server.url})
        opts = connect_options(anonymous)
        opts.update(allow_reconnect=False, max_reconnect_attempts=1, error_cb=_quiet)
        with pytest.raises(Exception, match=r"(?i)authorization"):
            await nats.connect(**opts)


async def _quiet(exc: Exception) -> None:
    pass


# --- secrets are never shown ----------------------------------------------------------------------

DB_PASSWORD = "db-S3cret-9f2c"  # Postgres trusts local connections here: the password is carried, unused
NATS_PASSWORD = "nats-S3cret-77aa"
NATS_TOKEN = "nats-T0ken-5b1e"
NKEY_SEED = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode()  # a user's, made here
SECRETS = (DB_PASSWORD, NATS_PASSWORD, NATS_TOKEN, NKEY_SEED)


def with_password(url: str, password: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{password}@", 1)


class ReplicaProcess:
    """`timer-service run` with DEBUG JSON logs captured to a file."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TIMER_")}
        full = clean | env | {"TIMER_LOG_LEVEL": "DEBUG", "TIMER_LOG_FORMAT": "json", "TIMER_HTTP_PORT": "0"}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "worker", "run"], env=full, stdout=out, stderr=out, cwd=ROOT
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def actions(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.text().splitlines():
            try:
                lines.append(json.loads(line))
            except ValueError:
                lines.append({"action": None, "raw": line})
        return lines

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def logged_error(replica: ReplicaProcess, mentioning: str) -> bool:
    """True once a log line's `error` (connect_retry, nats_error) mentions this."""
    return any(mentioning in str(a.get("error")) for a in replica.actions())


async def test_secrets_never_reach_the_logs(settings: Settings, db_url: str, tmp_path: Path) -> None:
    auth = "authorization {\n  user: timer\n  password: " + json.dumps(NATS_PASSWORD) + "\n}"
    with EmbeddedNats(tmp_path / "auth-nats", extra_config=auth) as nats_server:
        base = settings_env(settings) | {
            "TIMER_DATABASE_URL": with_password(db_url, DB_PASSWORD),
            "TIMER_NATS_URL": nats_server.url,
            "TIMER_NATS_USER": "timer",
        }
        # It works: the secrets are used, and a timer fires.
        good = ReplicaProcess(base | {"TIMER_NATS_PASSWORD": NATS_PASSWORD}, tmp_path / "good.log")
        # A DSN that libpq would quote back in its error (a bad %-escape in the password) is a bad
        # setting: it stops start-up with one line naming it, without the password.
        bad_dsn = ReplicaProcess(
            base | {"TIMER_DATABASE_URL": with_password(db_url, f"%zz{DB_PASSWORD}")},
            tmp_path / "bad-dsn.log",
        )
        # It fails, and says why, in a loop: a wrong NATS password and token, a seed; a Postgres
        # that is not there.
        failing = [
            ReplicaProcess(
                base
                | {
                    "TIMER_NATS_PASSWORD": NATS_PASSWORD[::-1],
                    "TIMER_NATS_TOKEN": NATS_TOKEN,
                    "TIMER_NATS_NKEY_SEED": NKEY_SEED,
                },
                tmp_path / "bad-nats.log",
            ),
            ReplicaProcess(
                base | {"TIMER_DATABASE_URL": f"postgresql://postgres:{DB_PASSWORD}@127.0.0.1:1/x"},
                tmp_path / "no-pg.log",
            ),
        ]
        try:
            await until(lambda: any(a.get("action") == "replica_started" for a in good.actions()), timeout=30)
            async with await TimerClient.connect(
                nats_server.url, settings.subject_prefix, user="timer", password=NATS_PASSWORD
            ) as client:
                await client.schedule("acme", "secret-keeper", datetime.now(UTC))
            await until(lambda: "secret-keeper" in str(query_state(db_url)), what="the timer fired")
            await until(lambda: logged_error(failing[0], "uthorization"), timeout=40, what="nats refusal")
            await until(lambda: logged_error(failing[1], "127.0.0.1"), timeout=40, what="no Postgres")
            bad_dsn_code = await asyncio.to_thread(bad_dsn.proc.wait, 30)
        finally:
            codes = [r.stop() for r in (good, *failing)]
    assert codes == [0, 0, 0]
    assert bad_dsn_code == 2
    assert bad_dsn.text().strip() == (
        "timer-service: TIMER_DATABASE_URL: not a PostgreSQL URL or conninfo (invalid percent-encoded token)"
    )
    started = next(a for a in good.actions() if a.get("action") == "replica_started")
    assert started["database"] == mask_url(with_password(db_url, DB_PASSWORD))
    assert ":***@" in started["database"]
    for replica in (good, *failing, bad_dsn):
        text = replica.text()
        assert text.strip()
        for secret in SECRETS:
            assert secret not in text, f"{secret} in {replica.log.name}"


def query_state(db_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute("SELECT service_call_id, state FROM timers WHERE state = 'Reached'").fetchall()


def test_cli_lines_never_show_the_password(db_url: str) -> None:
    ok = cli("status", env={"TIMER_DATABASE_URL": with_password(db_url, DB_PASSWORD)})
    assert ok.returncode == 0 and DB_PASSWORD not in ok.stdout + ok.stderr
    quoted = cli("migrate", env={"TIMER_DATABASE_URL": with_password(db_url, f"%zz{DB_PASSWORD}")})
    assert quoted.returncode == 2  # a bad setting
    assert one_line(quoted) == (
        "timer-service: TIMER_DATABASE_URL: not a PostgreSQL URL or conninfo (invalid percent-encoded token)"
    )


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://u:pw%40x@db:5432/t", "postgresql://u:***@db:5432/t"),
        ("postgresql://u:p@ss@db/t", "postgresql://u:***@db/t"),
        (
            "postgresql://u@db/t?sslmode=verify-full&password=pw1&x=1",
            "postgresql://u@db/t?sslmode=verify-full&password=***&x=1",
        ),
        ("host=db user=u password='a b' sslmode=require", "host=db user=u password=*** sslmode=require"),
        ("postgresql://u@db/t", "postgresql://u@db/t"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_nats_url_userinfo_is_masked_as_a_token() -> None:
    assert mask_url("nats://tok123@a:4222,nats://u:pw@b:4222", userinfo_is_secret=True) == (
        "nats://***@a:4222,nats://u:***@b:4222"
    )


def test_every_secret_setting_is_hidden_from_log_lines(capsys: pytest.CaptureFixture[str]) -> None:
    s = load_settings(
        database_url='postgresql://u:q%22uote"d@db/t?password=second-pw',
        nats_url="nats://url-token@a:4222",
        nats_password=NATS_PASSWORD,
        nats_token=NATS_TOKEN,
        nats_nkey_seed=NKEY_SEED,
    )
    assert secret_values(s) >= {'q%22uote"d', 'q"uote"d', "second-pw", "url-token", *SECRETS[1:]}
    record = logging.makeLogRecord(
        {"msg": "oops %s", "args": ('q"uote"d',), "error": f"{NATS_TOKEN} url-token second-pw {NKEY_SEED}"}
    )
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        line = formatter.format(record)
        assert "***" in line
        for secret in ('uote"d', 'uote\\"d', NATS_TOKEN, "url-token", "second-pw", NKEY_SEED):
            assert secret not in line


def test_security_doc_lists_every_credential_and_tls_setting() -> None:
    doc = (ROOT / "docs" / "SECURITY.md").read_text()
    security = [n for n in Settings.model_fields if n == "database_url" or n.startswith("nats_")]
    missing = [f"TIMER_{n.upper()}" for n in security if f"TIMER_{n.upper()}" not in doc]
    assert missing == []
    assert "docs/SECURITY.md" in (ROOT / "README.md").read_text()


# --- tenants against each other (issue 19) --------------------------------------------------------


async def test_a_tenant_cannot_make_another_tenants_event_vanish(settings: Settings, db_url: str) -> None:
    """Defect 1: mallory, allowed to publish on its own subjects, publishes on its own `due`
    subject first, with the id the victim's firing would carry if it were the envelope id
    (`<tenant>:<serviceCallId>:<dueAt ms>`, public in the docs). The events stream deduplicates
    across every subject: the victim's event was dropped, its PubAck a success, the timer recorded
    Reached, and nothing delivered. Now the Nats-Msg-Id is an HMAC nobody outside can work out."""
    p = settings.subject_prefix
    (now,) = query(db_url, "SELECT now()")[0]
    due = (now + timedelta(seconds=2)).replace(microsecond=0)
    envelope_id = f"victim:sc-1:{round(due.timestamp() * 1000)}"
    async with running_replica(settings), jetstream(settings) as js:
        forged = await js.publish(f"{p}.mallory.timer.due", b"{}", headers={"Nats-Msg-Id": envelope_id})
        assert forged.stream == settings.event_stream and not forged.duplicate
        body = {"tenantId": "victim", "serviceCallId": "sc-1", "dueAt": due.isoformat()}
        await publish_raw(js, settings, "victim", "schedule", body)

        def reached() -> bool:
            r = row(db_url, "victim", "sc-1")
            return r is not None and r["state"] == "Reached"

        # Reached only after JetStream acknowledged the event: stored, or dropped as a duplicate.
        await until(reached, timeout=30, what="the victim's timer reached")
        event = await js.get_last_msg(settings.event_stream, f"{p}.victim.timer.due")
    assert json.loads(event.data)["id"] == envelope_id, "the contract's envelope id is unchanged"
    assert event.headers is not None
    msg_id = event.headers["Nats-Msg-Id"]
    assert len(msg_id) == 32 and "victim" not in msg_id and "sc-1" not in msg_id


def tenant_permissions(tenant: str) -> str:
    """docs/SECURITY.md's permissions block, verbatim, for `tenant` instead of acme."""
    doc = (ROOT / "docs" / "SECURITY.md").read_text()
    block = re.search(r"```conf\n(permissions: \{.*?\n\})\n```", doc, re.DOTALL)
    assert block is not None, "docs/SECURITY.md lost its permissions block"
    return block.group(1).replace("acme", tenant)


class Tenants:
    """A nats-server whose users are the service (all permissions) and tenants acme and zeta
    with exactly docs/SECURITY.md's block, a replica on it, and the operator's `consumer add`
    run for both tenants, as the document says."""

    def __init__(self, server: EmbeddedNats, service: Settings, passwords: dict[str, str]) -> None:
        self.server, self.service, self.passwords = server, service, passwords
        self.refused: list[str] = []  # the server's -ERR lines on tenants' connections

    async def connect(self, tenant: str) -> TimerClient:
        async def collect(exc: Exception) -> None:
            self.refused.append(str(exc))

        return await TimerClient.connect(
            self.server.url,
            "svc",
            user=tenant,
            password=self.passwords[tenant],
            inbox_prefix=f"_INBOX_{tenant}",
            error_cb=collect,
            fast_ingest="off",  # as docs/SECURITY.md says: "auto" would ask for the stream's info
        )

    def violations(self, kind: str, subject: str) -> int:
        # nats-py lower-cases the server's -ERR line, subject included
        return sum(1 for e in self.refused if f'{kind} to "{subject}"'.lower() in e.lower())

    async def refuse(self, expected: list[tuple[str, str]]) -> None:
        """Until the server refused each (kind, subject) at least once."""
        try:
            await until(lambda: all(self.violations(*e) for e in expected), what="a violation for each")
        except TimeoutError:
            raise AssertionError(f"not refused: {[e for e in expected if not self.violations(*e)]}") from None

    @contextlib.asynccontextmanager
    async def service_js(self) -> AsyncIterator[Any]:
        """JetStream as the service's own user sees it."""
        nc = await nats_connect(self.server.url, user="timer", password=self.passwords["timer"])
        try:
            yield nc.jetstream()
        finally:
            await nc.close()


@contextlib.asynccontextmanager
async def tenants(settings: Settings, tmp_path: Path) -> AsyncIterator[Tenants]:
    pw = {user: secrets.token_hex(8) for user in ("timer", "acme", "zeta")}
    users = [f'{{ user: timer, password: "{pw["timer"]}" }}'] + [
        f'{{ user: {t}, password: "{pw[t]}", {tenant_permissions(t)} }}' for t in ("acme", "zeta")
    ]
    defaults = {"subject_prefix": "svc", "command_stream": "TIMER_COMMANDS", "event_stream": "TIMER_EVENTS"}
    defaults |= {"dlq_stream": "TIMER_DLQ", "consumer": "timer-service"}
    config = f"authorization {{ users: [ {', '.join(users)} ] }}"
    with EmbeddedNats(tmp_path / "nats", extra_config=config) as server:
        service = settings.model_copy(
            update={
                "nats_url": server.url,
                "nats_user": "timer",
                "nats_password": SecretStr(pw["timer"]),
                **defaults,
            }
        )
        async with running_replica(service):
            for tenant in ("acme", "zeta"):  # the operator's step, as docs/SECURITY.md writes it
                added = await asyncio.to_thread(
                    cli, "consumer", "add", "--tenant", tenant, env=settings_env(service)
                )
                assert (added.returncode, added.stderr) == (0, ""), added.stderr
                assert added.stdout == (
                    f"consumer {tenant} on TIMER_EVENTS: svc.{tenant}.timer.due, pull\n"
                    f"consumer {tenant} on TIMER_DLQ: svc.{tenant}.timer.dlq, pull\n"
                )
            yield Tenants(server, service, pw)


async def test_a_tenant_with_the_documented_permissions_does_its_own_work_and_nothing_else(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """A nats-server whose tenants have exactly the permissions docs/SECURITY.md recommends: acme
    schedules (one by one and in bulk), cancels, gets, pauses and resumes, and reads its own
    events (due_events) and DLQ from the consumers the operator provisioned; it cannot publish
    on `due` or `dlq` (its own included), on zeta's subjects, nor reach zeta's consumers, nor
    create or change a consumer (issue 31: a consumer's creator chooses its deliver subject)."""
    async with tenants(settings, tmp_path) as t, await t.connect("acme") as acme:
        # Its own work: schedule, schedule_many, cancel, get.
        (now,) = query(db_url, "SELECT now()")[0]
        await acme.schedule("acme", "fires", now + timedelta(seconds=0.5))
        await acme.schedule("acme", "cancelled", now + timedelta(hours=1))
        later = (now + timedelta(hours=2)).isoformat()
        sent = await acme.schedule_many(
            [{"tenantId": "acme", "serviceCallId": f"bulk-{i}", "dueAt": later} for i in range(3)]
        )
        assert [x.outcome for x in sent] == ["accepted"] * 3, sent
        await acme.cancel("acme", "cancelled")
        await until(
            lambda: (r := row(db_url, "acme", "cancelled")) is not None and r["state"] == "Cancelled",
            what="the cancel applied",
        )
        view = await acme.get("acme", "cancelled")
        assert view is not None and view["state"] == "Cancelled"
        # Pause and resume its own timers, as a producer (docs/SECURITY.md's block allows it).
        await acme.pause("acme")
        await until(lambda: query(db_url, "SELECT count(*) FROM paused_tenants") == [(1,)], what="paused")
        await acme.resume("acme")
        await until(
            lambda: query(db_url, "SELECT count(*) FROM paused_tenants WHERE paused_at IS NULL") == [(1,)],
            what="resumed",
        )
        await acme.nc.publish("svc.acme.timer.schedule", b"not json")  # one for its DLQ
        # Its events, through the client's own consumer loop on the provisioned consumer.
        async with contextlib.aclosing(acme.due_events("acme", durable="acme")) as events:
            event = await asyncio.wait_for(anext(events), timeout=30)
            assert (event.subject, event.event["type"]) == ("svc.acme.timer.due", "DueTimeReached")
            assert event.payload["serviceCallId"] == "fires"
            event.ack()
        # Its DLQ, through the provisioned pull consumer.
        dlq = await acme.js.pull_subscribe_bind("acme", stream="TIMER_DLQ")
        (msg,) = await dlq.fetch(1, timeout=30)
        assert msg.subject == "svc.acme.timer.dlq" and msg.data == b"not json"
        assert msg.headers and msg.headers["Timer-Error"] == "invalid_json"
        await msg.ack_sync()
        assert not t.refused, t.refused

        # Nothing else. Each refusal is the server's answer, in order on this connection.
        forbidden = [
            "svc.acme.timer.due",
            "svc.acme.timer.dlq",
            "svc._timer.wake",
            "svc.zeta.timer.schedule",
            "svc.zeta.timer.cancel",
            "svc.zeta.timer.get",
            "svc.zeta.timer.pause",
            "svc.zeta.timer.resume",
            # No consumer is created or changed by a tenant, on a pinned filter or not.
            "$JS.API.CONSUMER.CREATE.TIMER_EVENTS.acme.svc.acme.timer.due",
            "$JS.API.CONSUMER.CREATE.TIMER_DLQ.acme.svc.acme.timer.dlq",
            "$JS.API.CONSUMER.CREATE.TIMER_EVENTS.zeta.svc.zeta.timer.due",
            "$JS.API.CONSUMER.DURABLE.CREATE.TIMER_EVENTS.acme",
            "$JS.API.CONSUMER.DELETE.TIMER_EVENTS.acme",
            # zeta's consumers.
            "$JS.API.CONSUMER.INFO.TIMER_EVENTS.zeta",
            "$JS.API.CONSUMER.MSG.NEXT.TIMER_DLQ.zeta",
            "$JS.API.CONSUMER.MSG.NEXT.TIMER_EVENTS.zeta",
            # The streams themselves.
            "$JS.API.STREAM.INFO.TIMER_COMMANDS",
            "$JS.API.STREAM.MSG.GET.TIMER_EVENTS",
            "$JS.API.DIRECT.GET.TIMER_EVENTS",
        ]
        for subject in forbidden:
            await acme.nc.publish(subject, b"{}", headers={"Nats-Msg-Id": "forged"})
        for subject in ("svc.>", "_INBOX.>", "_INBOX_zeta.>"):
            await acme.nc.subscribe(subject)
        await t.refuse(
            [("publish", s) for s in forbidden]
            + [("subscription", s) for s in ("svc.>", "_INBOX.>", "_INBOX_zeta.>")]
        )
        assert acme.nc.is_connected
        # The streams hold what the service wrote and nothing acme sent on the way out.
        async with t.service_js() as service_js:
            events = await service_js.stream_info("TIMER_EVENTS")
            dlq_info = await service_js.stream_info("TIMER_DLQ")
            commands = await service_js.stream_info("TIMER_COMMANDS")
    assert events.state.last_seq == 1 and dlq_info.state.last_seq == 1, "one event, one DLQ copy"
    assert commands.state.last_seq == 9, "acme's 2 + 3 schedules, its cancel, pause, resume and bad command"


async def test_a_tenant_cannot_point_a_consumer_at_the_wake_subject(
    settings: Settings, tmp_path: Path
) -> None:
    """Issue 31, defect 3: the block allowed a tenant to create a consumer on its own DLQ, and the
    request's body chose where it delivers: a push consumer delivering onto the wake subject had
    every replica claim for each of its entries, redelivered without end after the tenant left.
    Now a tenant creates no consumer at all, under the provisioned name or another."""
    async with tenants(settings, tmp_path) as t, await t.connect("acme") as acme:
        for name in ("acme", "evil"):
            config = api.ConsumerConfig(
                name=name,
                durable_name=name,
                filter_subject="svc.acme.timer.dlq",
                deliver_subject="svc._timer.wake",
                ack_policy=api.AckPolicy.EXPLICIT,
                ack_wait=1,
            )
            with pytest.raises(nats.errors.TimeoutError):  # refused: no answer comes
                await acme.js.add_consumer("TIMER_DLQ", config=config, timeout=2)
        await t.refuse(
            [
                ("publish", f"$JS.API.CONSUMER.CREATE.TIMER_DLQ.{n}.svc.acme.timer.dlq")
                for n in ("acme", "evil")
            ]
        )
        async with t.service_js() as service_js:
            consumers = await service_js.consumers_info("TIMER_DLQ")
    assert {(c.name, c.config.deliver_subject) for c in consumers} == {("acme", None), ("zeta", None)}


async def test_several_readers_share_the_tenants_consumer_with_the_documented_permissions(
    settings: Settings, tmp_path: Path
) -> None:
    """A consumer service of three pods reads the one provisioned consumer from each: every event
    is given to one reader, asked for with CONSUMER.MSG.NEXT and delivered to the tenant's own
    inbox, which the block allows; more events than one reader asks for at a time (pulls.py)."""
    count = 3 * PULL_BATCH
    async with tenants(settings, tmp_path) as t:
        async with t.service_js() as service_js:  # stored as the service would, without firing each
            for i in range(count):
                await service_js.publish("svc.acme.timer.due", json.dumps({"id": f"e-{i}"}).encode())
        readers = [await t.connect("acme") for _ in range(3)]
        got: list[list[str]] = [[] for _ in readers]

        async def read(client: TimerClient, into: list[str]) -> None:
            async for event in client.due_events("acme", durable="acme"):
                into.append(event.id)
                event.ack()

        tasks = [asyncio.create_task(read(c, into)) for c, into in zip(readers, got, strict=True)]
        try:
            await until(lambda: sum(map(len, got)) >= count, timeout=60, what="every event read")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)
            for client in readers:
                await client.close()
        assert sorted(e for into in got for e in into) == sorted(f"e-{i}" for i in range(count))
        assert not t.refused, t.refused


async def test_a_get_is_answered_only_where_its_tenant_listens(
    settings: Settings, db_url: str, tmp_path: Path
) -> None:
    """The service answers a `get` with its own permissions (the whole prefix, the JetStream API),
    and the request chooses the reply subject, which a tenant's publish permission does not
    limit: acme's gets answered on zeta's `due`, `dlq` and command subjects stored acme's timer,
    its `data` included, in zeta's event stream, DLQ and commands, one message a request. A get
    is answered only on an inbox: `_INBOX.…`, the tenant's own `_INBOX_<tenant>.…`, or a
    service import's `_R_.…`; anything else is dropped and counted."""
    async with tenants(settings, tmp_path) as t, await t.connect("acme") as acme:
        (now,) = query(db_url, "SELECT now()")[0]
        await acme.schedule("acme", "forged", now + timedelta(hours=1), data={"type": "DueTimeReached"})
        await until(lambda: row(db_url, "acme", "forged") is not None, what="acme's timer stored")
        elsewhere = [
            "svc.zeta.timer.due",
            "svc.zeta.timer.dlq",
            "svc.zeta.timer.schedule",
            "svc._timer.wake",
            "_INBOX_zeta.TIMER_EVENTS",
            "$JS.API.STREAM.PURGE.TIMER_EVENTS",
            "orders.created",
        ]
        before = REGISTRY.get_sample_value("timer_get_replies_refused_total") or 0.0
        for reply in elsewhere:
            await acme.nc.publish("svc.acme.timer.get", b'{"serviceCallId": "forged"}', reply=reply)
        # Answered in order on one subscription: this answer comes after all of the above.
        view = await acme.get("acme", "forged")
        assert view is not None and view["data"] == {"type": "DueTimeReached"}
        assert not t.refused, t.refused
        async with t.service_js() as service_js:
            # Stored after anything the replica sent before its answer to acme's own get.
            marker = await service_js.publish("svc.zeta.timer.due", b"marker")
            dlq_info = await service_js.stream_info("TIMER_DLQ")
            commands = await service_js.stream_info("TIMER_COMMANDS")
    assert marker.seq == 1, "zeta's events hold nothing acme sent"
    assert dlq_info.state.last_seq == 0, "zeta's DLQ holds nothing acme sent"
    assert commands.state.last_seq == 1, "acme's one schedule, no command of zeta's"
    refused = (REGISTRY.get_sample_value("timer_get_replies_refused_total") or 0.0) - before
    assert refused == len(elsewhere)


async def test_a_tenants_get_flood_does_not_hold_another_tenants_get(settings: Settings) -> None:
    """All of a replica's gets came through one subscription, answered one at a time in arrival
    order, each a lookup: acme's 20,000 gets (on an inbox, as its permissions allow) made zeta's
    one wait for all of them, 2.3 s, and past the client's 5 s timeout at about 50,000. Now each
    tenant's gets wait in a line of their own, served in turn a batch at a time: zeta's is
    answered before most of acme's, and what acme sent past its line's bound is dropped (counted)
    before any lookup. The answers come back on one subscription, in the order the replica sent
    them.

    Measured (one replica in the test's process, acme's flood flushed to the server, then zeta's
    TimerClient.get timed; 2 cores shared with other work): after 20,000 gets 7.0 s before, 0.15
    to 0.26 s now; after 50,000, 9.6 s (past the client's 5 s default) before, 0.33 to 0.9 s now.
    What is left grows with the flood: it is the time to read acme's messages off the socket
    ahead of zeta's (nats-py's parse, ~5-15 us a message; the callback's part is ~2 us)."""
    flood, body, p = 20_000, b'{"serviceCallId": "nothing"}', settings.subject_prefix
    async with running_replica(settings):
        nc = await nats.connect(settings.nats_url)
        try:
            answers: list[str] = []  # whose, in the order the replica sent them

            async def collect(msg: Any) -> None:
                answers.append(msg.subject.rpartition(".")[2])

            await nc.subscribe("_INBOX.flood.*", cb=collect)
            shed_before = REGISTRY.get_sample_value("timer_get_requests_shed_total") or 0.0
            for _ in range(flood):
                await nc.publish(f"{p}.acme.timer.get", body, reply="_INBOX.flood.acme")
            await nc.publish(f"{p}.zeta.timer.get", body, reply="_INBOX.flood.zeta")
            started = asyncio.get_running_loop().time()
            await until(lambda: "zeta" in answers, timeout=60, what="zeta's answer")
            took = asyncio.get_running_loop().time() - started

            def settled() -> bool:
                shed = (REGISTRY.get_sample_value("timer_get_requests_shed_total") or 0.0) - shed_before
                return len(answers) + shed == flood + 1

            await until(settled, timeout=60, what="each of acme's gets answered or shed")
        finally:
            await nc.close()
    ahead = answers.index("zeta")
    assert ahead < flood // 4, f"{ahead} of acme's gets answered before zeta's, in {took:.3f} s"
    assert len(answers) > 100, "acme's newest gets are answered"
