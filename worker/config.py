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
    # A connection per batch in flight across its publish, and intake's and the others' beside them.
    db_pool_size: int = Field(6, ge=4, le=100)
    # false: never change the schema; wait until `timer-service migrate` has applied it.
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
    events_duplicate_window: Duration = timedelta(minutes=2)
    # Fast-ingest batches ("on"), atomic ones ("off"), or whichever a replica measures the cheaper.
    events_fast_ingest: str = "auto"
    command_max_age: Duration = timedelta(days=1)
    # A command waiting behind an occurrence claimed longer than this goes to the DLQ (timer_stuck).
    stuck_after: Duration = timedelta(hours=1)
    # Unclaimed longer than this is downtime: a recurring timer then fires once for what it missed.
    downtime_after: Duration = timedelta(minutes=1)

    worker_id: str = Field(default_factory=_default_worker_id)
    batch_size: int = Field(1000, ge=1, le=20000)
    intake_batch_size: int = Field(1000, ge=1, le=20000)
    poll_interval_ms: int = Field(2000, ge=10, le=60000)
    lease_ms: int = Field(3000, ge=200, le=3_600_000)
    publish_timeout_ms: int = Field(2000, ge=50, le=60000)
    max_in_flight: int = Field(2000, ge=1, le=100000)
    # nats-py's pending_size while reconnecting; 0: publishes fail at once.
    publish_buffer_bytes: int = Field(2 * 1024 * 1024, ge=0)
    drain_timeout_ms: int = Field(10000, ge=0, le=600000)
    max_horizon: Duration = timedelta(days=3650)
    retention: Duration = timedelta(days=7)
    tenant_max_pending: int = Field(0, ge=0)
    carry_headers: str = ""
    # The largest `data`, as its events carry it; the largest event must fit max_payload.
    max_payload_bytes: int = Field(DEFAULT_MAX_PAYLOAD_BYTES, ge=0, le=MAX_BODY_BYTES)

    http_port: int = Field(8080, ge=0, le=65535)
    http_host: str = "0.0.0.0"
    log_level: str = "INFO"
    log_format: str = "json"

    @property
    def carried_names(self) -> frozenset[str]:
        """Lower-case: headers match in any case."""
        return frozenset(n.strip().lower() for n in self.carry_headers.split(",") if n.strip())

    @model_validator(mode="after")
    def _relations(self) -> Settings:
        for name in ("subject_prefix", "command_stream", "event_stream", "dlq_stream", "consumer"):
            if not TENANT_RE.match(getattr(self, name)):
                raise ValueError(f"{name}: must match {TENANT_RULE}")
        # database_url is libpq's to judge: worker/settings.py.
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
    """The operator console's settings besides the service's; the chart does not carry them."""

    console_host: str = "127.0.0.1"
    console_port: int = Field(8081, ge=0, le=65535)
    console_token: SecretStr | None = None
    console_user: str | None = None
    console_password: SecretStr | None = None
    console_actions: bool = False
    # Who may act (`token` names the token's holder); both empty: everyone who gets in.
    console_operators: str = ""
    console_operator_groups: str = ""
    # An identity proxy's headers, believed only from the trusted proxies: else any client names itself.
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
    return frozenset(n.strip() for n in text.split(",") if n.strip())


S = TypeVar("S", bound=Settings)

# TIMER_* variables that are not settings: the chaos suite's crash points and the tests' knobs.
NOT_SETTINGS = frozenset(
    {
        "TIMER_TEST_CRASH",
        "TIMER_TEST_DATABASE_URL",
        "TIMER_TEST_NATS_URL",
        "TIMER_CHAOS_SCALE",
        "TIMER_PAUSE_SCALE",
    }
)
# Kubernetes' service links: a Service named `timer-service` gives TIMER_SERVICE_SERVICE_HOST etc.
_SERVICE_LINK = re.compile(
    r"\w+_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT_\d+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)"
)
_SERVICE_LINK_PORT = re.compile(r"(tcp|udp|sctp)://\S+")


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The TIMER_* variables that name no setting: a typo would otherwise run on the default."""
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
    """Settings of `cls` from the environment and overrides; a bad one raises ConfigError, one line."""
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
    logs.hide(secret_values(settings))
    return settings


# A URL's user:password@ (the last '@' before the host ends it), a `password=` parameter or keyword.
_URL_USERINFO = re.compile(r"(?P<scheme>\w[\w+.-]*://)(?P<userinfo>[^/?#\s]*)@")
_PASSWORD_PARAM = re.compile(r"(?P<key>\bpassword\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'|[^&\s]+)", re.I)
# Shorter secrets are not hunted for in free text: masking every "ab" would ruin the logs.
MIN_SECRET_CHARS = 4


def mask_url(url: str, *, userinfo_is_secret: bool = False) -> str:
    """The URL (or libpq DSN) with its password replaced; `userinfo_is_secret`: a token too."""

    def userinfo(m: re.Match[str]) -> str:
        user, colon, _ = m["userinfo"].partition(":")
        if colon:
            return f"{m['scheme']}{user}:***@"
        return f"{m['scheme']}***@" if userinfo_is_secret else m[0]

    masked = _URL_USERINFO.sub(userinfo, url)
    return _PASSWORD_PARAM.sub(lambda m: f"{m['key']}***", masked)


def secret_values(s: Settings) -> set[str]:
    """Every secret these settings hold, as written and percent-decoded, for logs to mask."""
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
