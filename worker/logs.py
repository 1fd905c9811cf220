"""Structured logs: one JSON object per line with a stable `action` key."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from worker import tracing

# Not extras of ours: uvicorn adds `color_message`, its message again with ANSI colour codes.
_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "color_message"}
_hidden: set[str] = set()


def hide(secrets: set[str]) -> None:
    """Never write these strings: every log line and CLI error line replaces them with ***."""
    for secret in secrets:
        _hidden.add(secret)
        _hidden.add(json.dumps(secret)[1:-1])  # as it appears inside a JSON log line


def redact(text: str) -> str:
    # Longest first: a secret that contains another is replaced whole.
    for secret in sorted(_hidden, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _not_tls_eof_noise(record: logging.LogRecord) -> bool:
    # asyncio warns on every TLS connection nats-py closes; it means nothing to an operator.
    return "eof_received() has no effect when using ssl" not in record.getMessage()


def quiet_known_noise() -> None:
    asyncio_log = logging.getLogger("asyncio")
    if _not_tls_eof_noise not in asyncio_log.filters:
        asyncio_log.addFilter(_not_tls_eof_noise)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if tracing.on() and (ids := tracing.current_ids()):  # a line inside a span names it
            out["trace_id"], out["span_id"] = ids
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return redact(json.dumps(out, default=str))


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        extra = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        line = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.getMessage()} {extra}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return redact(line.rstrip())


THROTTLE_S = 10.0


class Throttled:
    """A warning that can come once per message, written at most once every `every_s`; the next
    line says in `suppressed` how many were left out."""

    __slots__ = ("_every_s", "_logger", "_next", "_now", "_suppressed")

    def __init__(
        self, logger: logging.Logger, every_s: float = THROTTLE_S, now: Callable[[], float] = time.monotonic
    ) -> None:
        self._logger, self._every_s, self._now = logger, every_s, now
        self._next = float("-inf")
        self._suppressed = 0

    def warning(self, msg: str, extra: dict[str, Any], exc_info: BaseException | None = None) -> None:
        now = self._now()
        if now < self._next:
            self._suppressed += 1
            return
        self._next = now + self._every_s
        if self._suppressed:
            extra = {**extra, "suppressed": self._suppressed}
            self._suppressed = 0
        self._logger.warning(msg, extra=extra, exc_info=exc_info)


def setup(level: str = "INFO", fmt: str = "json") -> None:
    logging.Formatter.converter = time.gmtime  # logs in UTC, like every timestamp here
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    quiet_known_noise()
    # nats-py logs every reconnect attempt at ERROR; our callbacks say it once, with context.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
