"""Every nats-py internal the own wire (worker/client/wire.py) relies on, one test each, against the
installed nats-py: a later nats-py that drops or reshapes one fails here, not in production.

Most uses fall back to nats-py's public path when a name is missing (slower, still correct), so
without these a rename would go unnoticed but in the benchmarks; `_process_info` has no fallback:
renamed, the TLS check would silently stop running. pyproject.toml states the tested range."""

from __future__ import annotations

import asyncio
import inspect
import re
import ssl
from collections.abc import Callable

import nats.aio.client
import nats.errors
import nats.protocol.parser
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from worker.client import wire


def coroutine_taking(owner: object, name: str, *params: str) -> None:
    """`owner.name` is a coroutine function whose parameters after self start with `params`."""
    method = getattr(owner, name)
    assert inspect.iscoroutinefunction(method), f"{name} is no longer a coroutine function"
    assert list(inspect.signature(method).parameters)[1 : 1 + len(params)] == list(params)


def test_process_info_is_where_the_tls_check_runs() -> None:
    coroutine_taking(NATS, "_process_info", "info", "initial_connection")
    client = wire._TlsEnforcingClient()
    client.options["tls"] = ssl.create_default_context()
    with pytest.raises(nats.errors.Error, match="not connecting in clear"):
        asyncio.run(client._process_info({"tls_required": False}, initial_connection=True))


def test_process_msg_is_what_the_parser_calls_for_each_message() -> None:
    coroutine_taking(NATS, "_process_msg", "sid", "subject", "reply", "data", "headers")
    # take_raw replaces it on the instance: the parser must look it up there, at each message
    assert "self.nc._process_msg(" in inspect.getsource(nats.protocol.parser)


def test_send_publish_encodes_one_message_into_pending() -> None:
    coroutine_taking(NATS, "_send_publish", "subject", "reply", "payload", "payload_size", "headers")
    nc = NATS()
    asyncio.run(nc._send_publish("a.b", "", b"x", 1, None))
    assert b"".join(nc._pending) == b"PUB a.b  1\r\nx\r\n"


def test_send_command_takes_encoded_commands() -> None:
    coroutine_taking(NATS, "_send_command", "cmd")
    nc = NATS()
    asyncio.run(nc._send_command(b"PUB a.b  1\r\nx\r\n"))
    assert b"".join(nc._pending) == b"PUB a.b  1\r\nx\r\n"


def test_flush_pending_wakes_the_flusher() -> None:
    coroutine_taking(NATS, "_flush_pending")


def test_pending_holds_what_is_not_written_yet() -> None:
    assert NATS()._pending == []  # joined by _wire_matches


def test_flush_queue_is_the_flushers_queue_once_connected() -> None:
    nc = NATS()
    assert hasattr(nc, "_flush_queue") and nc._flush_queue is None  # an asyncio.Queue once connected
    assert "self._flush_queue = asyncio.Queue(" in inspect.getsource(NATS.connect) + inspect.getsource(NATS)


def test_flusher_task_is_the_flushers_task_once_connected() -> None:
    nc = NATS()
    assert hasattr(nc, "_flusher_task") and nc._flusher_task is None
    assert "self._flusher_task = asyncio.get_running_loop().create_task(" in inspect.getsource(NATS)


def test_max_payload_is_the_servers_limit() -> None:
    assert isinstance(NATS()._max_payload, int)


def test_skip_subject_validation_is_the_connect_option() -> None:
    assert NATS()._skip_subject_validation is False
    assert "skip_subject_validation" in inspect.signature(NATS.connect).parameters


def test_stats_count_what_publish_sends() -> None:
    assert {"out_msgs", "out_bytes"} <= set(NATS().stats)


def test_validate_subject_refuses_what_publish_refuses() -> None:
    validate: Callable[[str], None] = nats.aio.client._validate_subject
    validate("a.b")
    for bad in ("", "a b", "a\tb"):
        with pytest.raises(nats.errors.BadSubjectError):
            validate(bad)


def test_header_key_re_is_publishs_check_of_a_key() -> None:
    key_re: re.Pattern[str] = nats.aio.client._HEADER_KEY_RE
    assert key_re.fullmatch("Nats-Msg-Id") and not key_re.fullmatch("a b") and not key_re.fullmatch("a:b")


def test_subject_invalid_re_is_whitespace() -> None:
    # publish_all checks a batch's replies by a scan for these characters, not the expression
    assert nats.aio.client._SUBJECT_INVALID_RE.pattern == r"[ \t\r\n]"
    assert wire._SUBJECT_WHITESPACE == " \t\r\n"


def test_a_jetstream_contexts_nc_is_its_connection() -> None:
    nc = NATS()
    assert wire.connection_of(nc.jetstream()) is nc


def test_a_subscriptions_id_is_its_sid() -> None:
    assert wire.subscription_id(Subscription(NATS(), id=7, subject="a")) == 7


def test_a_subscriptions_pending_queue_holds_what_it_was_not_given() -> None:
    sub = Subscription(NATS(), id=7, subject="a")
    assert wire.queued(sub) is None
    msg = Msg(NATS(), subject="a", data=b"x")
    sub._pending_queue.put_nowait(msg)
    assert wire.queued(sub) is msg and wire.queued(sub) is None
