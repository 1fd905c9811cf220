"""Settings: read once from TIMER_* environment variables, validated where they are built."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import urllib.parse
from collections.abc import Mapping
from datetime import timedelta
from typing import Annotated, Any, TypeVar

import isodate
from pydantic import BeforeValidator, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from worker import logs
from worker.contract import DEFAULT_MAX_PAYLOAD_BYTES, MAX_BODY_BYTES, TENANT_RE, TENANT_RULE
from worker.errors import ConfigError

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 365 * 86400}
_HEADER_NAME = re.compile(r"[a-z0-9_.-]{1,64}\Z")
_SHORT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w|y)\s*$")


def parse_duration(value: Any) -> timedelta:
    """A duration setting: `500ms`, `30s`, `7d`, `10y` or ISO 8601 (`PT1H`, `P7D`)."""
    if isinstance(value, timedelta):
        return value
    text = str(value)
    if m := _SHORT.match(text):
        return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    try:
        parsed = isodate.parse_duration(text.strip())
    except (isodate.ISO8601Error, ValueError):
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 30s, 7d or P7D)") from None
    if isinstance(parsed, isodate.Duration):  # years or months: take them as 365 / 30 days
        parsed = timedelta(days=int(parsed.years) * 365 + int(parsed.months) * 30) + parsed.tdelta
    if not isinstance(parsed, timedelta):
        raise ValueError(f"not a duration: {text!r}")
    return parsed


Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Every knob of a replica. The README lists them; Helm exposes them as values."""

    model_config = SettingsConfigDict(env_prefix="TIMER_", frozen=True, extra="ignore")

    database_url: SecretStr = SecretStr("postgresql://postgres@127.0.0.1:5432/postgres")
    # A replica holds a connection per batch in flight across its publish (PIPELINE_DEPTH
    # batches and the fresh lane's, worker/core/firing.py), and intake, the read model, the
    # gauges and a batch's expiry decisions (one short statement) need theirs beside them: 4 at least.
    db_pool_size: int = Field(6, ge=4, le=100)
    # false: this replica never changes the schema (a separate `timer-service migrate`, with its own
    # role, does); it waits until every migration it ships is applied.
    migrate: bool = True

    nats_url: str = "nats://127.0.0.1:4222"
    nats_user: str | None = None
    nats_password: SecretStr | None = None
    nats_token: SecretStr | None = None
    nats_nkey_seed: SecretStr | None = None
    nats_creds: str | None = None
    nats_tls_ca: str | None = None
    nats_tls_cert: str | None = None
    nats_tls_key: str | None = None
    nats_tls_server_name: str | None = None

    subject_prefix: str = "svc"
    command_stream: str = "TIMER_COMMANDS"
    event_stream: str = "TIMER_EVENTS"
    dlq_stream: str = "TIMER_DLQ"
    consumer: str = "timer-service"
    create_streams: bool = True
    stream_replicas: int = Field(1, ge=1, le=5)
    # JetStream drops a re-published firing with the same Nats-Msg-Id inside this window.
    events_duplicate_window: Duration = timedelta(minutes=2)
    # How events are published on nats-server 2.14+ (batches.Publisher.publish_atomic): fast-ingest
    # batches ("on"), atomic batches ("off"), or ("auto") fast-ingest on a replicated events
    # stream and where a replica measured them the cheaper (worker/adapters/jetstream/probe.py): a single
    # server under sync_interval: always fsyncs every message of a fast batch, an atomic batch once.
    events_fast_ingest: str = "auto"
    # How long an unacknowledged command may stay in the command stream (its redelivery horizon).
    command_max_age: Duration = timedelta(days=1)
    # A command waiting behind an occurrence first claimed longer ago than this, and still not
    # recorded, is given up: copied to the DLQ as timer_stuck (README, guarantees).
    stuck_after: Duration = timedelta(hours=1)
    # A recurring timer no replica claimed for longer than this (real downtime) fires once for the
    # missed window; a shorter wait (a crash, an overloaded fleet) skips no occurrence.
    downtime_after: Duration = timedelta(minutes=1)

    worker_id: str = Field(default_factory=_default_worker_id)
    batch_size: int = Field(1000, ge=1, le=20000)
    intake_batch_size: int = Field(1000, ge=1, le=20000)
    poll_interval_ms: int = Field(2000, ge=10, le=60000)
    lease_ms: int = Field(3000, ge=200, le=3_600_000)
    publish_timeout_ms: int = Field(2000, ge=50, le=60000)
    max_in_flight: int = Field(2000, ge=1, le=100000)
    # Publishes nats-py holds while reconnecting (its pending_size); 0: none, they fail at once.
    publish_buffer_bytes: int = Field(2 * 1024 * 1024, ge=0)
    drain_timeout_ms: int = Field(10000, ge=0, le=600000)
    max_horizon: Duration = timedelta(days=3650)
    retention: Duration = timedelta(days=7)
    tenant_max_pending: int = Field(0, ge=0)
    # Producer headers a ScheduleTimer carries to its DueTimeReached events, besides traceparent and
    # tracestate: comma-separated names (docs/CONTRACT.md, Trace context).
    carry_headers: str = ""
    # The largest `data` a ScheduleTimer may carry, in bytes as its events carry it (jsonb's text:
    # worker.core.fields._data; payload_too_large beyond). It is stored in each timer's row and sent
    # in each of its events; 0 refuses any. The largest event it allows must fit the server's
    # max_payload (streams.check_sizes). At most MAX_BODY_BYTES, a command body's own bound.
    max_payload_bytes: int = Field(DEFAULT_MAX_PAYLOAD_BYTES, ge=0, le=MAX_BODY_BYTES)

    http_port: int = Field(8080, ge=0, le=65535)
    http_host: str = "0.0.0.0"
    log_level: str = "INFO"
    log_format: str = "json"

    @property
    def carried_names(self) -> frozenset[str]:
        """TIMER_CARRY_HEADERS as lower-case names (headers match in any case)."""
        return frozenset(n.strip().lower() for n in self.carry_headers.split(",") if n.strip())

    @model_validator(mode="after")
    def _relations(self) -> Settings:
        for name in ("subject_prefix", "command_stream", "event_stream", "dlq_stream", "consumer"):
            # Subject and stream name tokens: the tenant rule, so a trailing newline fails too.
            if not TENANT_RE.match(getattr(self, name)):
                raise ValueError(f"{name}: must match {TENANT_RULE}")
        # database_url's syntax is libpq's to judge: the Postgres adapter checks it (worker/settings.py).
        if self.publish_timeout_ms >= self.lease_ms:
            raise ValueError("publish_timeout_ms: must be shorter than TIMER_LEASE_MS")
        horizon = timedelta(milliseconds=self.lease_ms + 3 * self.publish_timeout_ms)
        if self.events_duplicate_window <= horizon:
            raise ValueError(
                f"events_duplicate_window: must exceed the lease plus the publish retry horizon ({horizon})"
            )
        if not timedelta(milliseconds=self.lease_ms) < self.stuck_after < self.command_max_age:
            raise ValueError(
                "stuck_after: must be longer than TIMER_LEASE_MS and shorter than TIMER_COMMAND_MAX_AGE"
            )
        if self.downtime_after < timedelta(milliseconds=self.lease_ms + self.poll_interval_ms):
            raise ValueError("downtime_after: must be at least TIMER_LEASE_MS plus TIMER_POLL_INTERVAL_MS")
        if self.retention < self.command_max_age:
            raise ValueError("retention: must not be shorter than TIMER_COMMAND_MAX_AGE")
        for name in self.carried_names:
            if not _HEADER_NAME.match(name) or name.startswith("nats-"):
                raise ValueError(
                    f"carry_headers: {name!r} is not a header name a producer may send "
                    "(letters, digits and -_.; not Nats-*, which NATS reserves)"
                )
        if self.events_fast_ingest not in ("auto", "on", "off"):
            raise ValueError("events_fast_ingest: must be auto, on or off")
        if self.log_format not in ("json", "text"):
            raise ValueError("log_format: must be json or text")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("log_level: must be DEBUG, INFO, WARNING or ERROR")
        if bool(self.nats_tls_cert) != bool(self.nats_tls_key):
            raise ValueError("nats_tls_cert: TIMER_NATS_TLS_CERT and TIMER_NATS_TLS_KEY go together")
        # Checked here: Python's TLS layer reports a missing file without naming it.
        for name in ("nats_creds", "nats_tls_ca", "nats_tls_cert", "nats_tls_key"):
            path = getattr(self, name)
            if path and not os.access(path, os.R_OK):
                raise ValueError(f"{name}: cannot read {path}")
        return self


class ConsoleSettings(Settings):
    """The operator console's settings besides the service's (`timer-service console`): its own
    process and port, never the replicas', so the chart does not carry them."""

    console_host: str = "127.0.0.1"
    console_port: int = Field(8081, ge=0, le=65535)
    console_token: SecretStr | None = None
    console_user: str | None = None
    console_password: SecretStr | None = None
    # false: the console only reads; true: operators can also act (docs/SECURITY.md, The console).
    console_actions: bool = False
    # Who is an operator (may act, with actions on), comma-separated: user names (`token` for the
    # token's holder) and groups (TIMER_CONSOLE_GROUPS_HEADER's). Both empty: everyone who gets
    # in; otherwise everyone else may only read.
    console_operators: str = ""
    console_operator_groups: str = ""
    # An identity proxy in front (oauth2-proxy): the header naming the user it authenticated
    # (X-Forwarded-User), and the one listing the user's groups, comma-separated. Believed only
    # from TIMER_CONSOLE_TRUSTED_PROXIES (addresses or networks, comma-separated): from anyone
    # else the headers are ignored, or any client could name itself. From those proxies the
    # client's address they forward (X-Forwarded-For) is the source the console throttles wrong
    # guesses by, not the proxy's own.
    console_user_header: str = ""
    console_groups_header: str = ""
    console_trusted_proxies: str = ""

    @property
    def operator_names(self) -> frozenset[str]:
        return _names(self.console_operators)

    @property
    def operator_groups(self) -> frozenset[str]:
        return _names(self.console_operator_groups)

    @property
    def trusted_proxies(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(a, strict=False) for a in _names(self.console_trusted_proxies))

    @model_validator(mode="after")
    def _credentials(self) -> ConsoleSettings:
        if bool(self.console_user) != bool(self.console_password):
            raise ValueError("console_user: TIMER_CONSOLE_USER and TIMER_CONSOLE_PASSWORD go together")
        if self.console_user == "token":
            raise ValueError("console_user: `token` names the token's holder; give the user another name")
        if not (self.console_token or self.console_user or self.console_user_header):
            raise ValueError(
                "console_token: the console needs TIMER_CONSOLE_TOKEN, or TIMER_CONSOLE_USER and "
                "TIMER_CONSOLE_PASSWORD, or TIMER_CONSOLE_USER_HEADER behind an identity proxy"
            )
        self._proxy()
        for name in ("console_token", "console_password"):
            secret = getattr(self, name)
            if secret is not None and len(secret.get_secret_value()) < 12:
                raise ValueError(f"{name}: must be at least 12 characters")
        return self

    def _proxy(self) -> None:
        for name in ("console_user_header", "console_groups_header"):
            header = getattr(self, name)
            if header and not _HEADER_NAME.match(header.lower()):
                raise ValueError(f"{name}: not a header name: {header!r}")
        if self.console_groups_header and not self.console_user_header:
            raise ValueError("console_groups_header: needs TIMER_CONSOLE_USER_HEADER, the user's own")
        if self.console_user_header and not self.console_trusted_proxies:
            raise ValueError(
                "console_trusted_proxies: TIMER_CONSOLE_USER_HEADER needs the proxies' addresses: "
                "from anyone else the header is a client naming itself"
            )
        for address in _names(self.console_trusted_proxies):
            try:
                ipaddress.ip_network(address, strict=False)
            except ValueError:
                raise ValueError(f"console_trusted_proxies: not an address or network: {address!r}") from None


def _names(text: str) -> frozenset[str]:
    """A comma-separated setting's names."""
    return frozenset(n.strip() for n in text.split(",") if n.strip())


S = TypeVar("S", bound=Settings)

# TIMER_* variables that are not settings and are read all the same: the chaos suite's crash
# points (a replica reads it: worker/core/crashpoints.py) and the test suite's knobs (tests/).
NOT_SETTINGS = frozenset(
    {
        "TIMER_TEST_CRASH",
        "TIMER_TEST_DATABASE_URL",
        "TIMER_TEST_NATS_URL",
        "TIMER_CHAOS_SCALE",
        "TIMER_PAUSE_SCALE",
    }
)
# What Kubernetes puts in every pod for each Service of its namespace (and Docker for a link): a
# Service named `timer-service`, as the chart names it when the release is, gives
# TIMER_SERVICE_SERVICE_HOST, TIMER_SERVICE_PORT=tcp://..., TIMER_SERVICE_PORT_8080_TCP_ADDR.
_SERVICE_LINK = re.compile(
    r"\w+_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)"
)
_SERVICE_LINK_PORT = re.compile(r"(tcp|udp|sctp)://\S+")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The TIMER_* variables of `environ` that name no setting: a typo there was ignored, and the
    replica ran on the default it meant to change."""
    known = {f"TIMER_{name.upper()}" for name in ConsoleSettings.model_fields} | NOT_SETTINGS
    return sorted(
        name
        for name, value in environ.items()
        if name.upper().startswith("TIMER_")
        and name.upper() not in known
        and not _SERVICE_LINK.fullmatch(name)
        and not (name.upper().endswith("_PORT") and _SERVICE_LINK_PORT.fullmatch(value))
    )


def build(cls: type[S], overrides: dict[str, Any]) -> S:
    """Settings of `cls` from the environment (and overrides); a bad one raises ConfigError, one
    line, as does a TIMER_* variable that names no setting. Entry points call worker/settings.py's
    load_settings, which also checks the database URL."""
    if unknown := unknown_variables(os.environ):
        raise ConfigError(f"{', '.join(unknown)}: not a setting (a typo? README, Configuration, lists them)")
    try:
        settings = cls(**overrides)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if not loc and ":" in msg:
            loc, msg = (s.strip() for s in msg.split(":", 1))
        name = f"TIMER_{loc.upper()}" if loc else "settings"
        raise ConfigError(f"{name}: {msg}") from None
    logs.hide(secret_values(settings))  # from here on no log line or error line shows them
    return settings


# A URL's user:password@ (the password may hold '@': the last '@' before the host ends it), a
# `password=` query parameter or libpq keyword (quoted or not).
_URL_USERINFO = re.compile(r"(?P<scheme>\w[\w+.-]*://)(?P<userinfo>[^/?#\s]*)@")
_PASSWORD_PARAM = re.compile(r"(?P<key>\bpassword\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^&\s]+)", re.I)
# Shorter secrets are not hunted for in free text (masking every "ab" would ruin the logs); they
# are still never logged on purpose: URLs are masked by their structure.
MIN_SECRET_CHARS = 4


def mask_url(url: str, *, userinfo_is_secret: bool = False) -> str:
    """The URL (or libpq keyword DSN) with its password replaced, for logs and `status`.

    `userinfo_is_secret`: a user part without ':' is a secret too (NATS takes `nats://TOKEN@host`).
    """

    def userinfo(m: re.Match[str]) -> str:
        user, colon, _ = m["userinfo"].partition(":")
        if colon:
            return f"{m['scheme']}{user}:***@"
        return f"{m['scheme']}***@" if userinfo_is_secret else m[0]

    masked = _URL_USERINFO.sub(userinfo, url)
    return _PASSWORD_PARAM.sub(lambda m: f"{m['key']}***", masked)


def secret_values(s: Settings) -> set[str]:
    """Every secret these settings hold, as written and percent-decoded: what an error message
    quoting a setting could repeat (libpq quotes a bad DSN token, password included)."""
    found: set[str] = set()
    console = (s.console_token, s.console_password) if isinstance(s, ConsoleSettings) else ()
    for secret in (s.nats_password, s.nats_token, s.nats_nkey_seed, *console):
        if secret is not None:
            found.add(secret.get_secret_value())
    for url, token_ok in [(s.database_url.get_secret_value(), False)] + [
        (u, True) for u in s.nats_url.split(",")
    ]:
        for m in _URL_USERINFO.finditer(url):
            user, colon, password = m["userinfo"].partition(":")
            if colon:
                found.add(password)
            elif token_ok:
                found.add(user)
        for m in _PASSWORD_PARAM.finditer(url):
            found.add(m["value"].strip("'"))
    found |= {urllib.parse.unquote(v) for v in found}
    return {v for v in found if len(v) >= MIN_SECRET_CHARS}
