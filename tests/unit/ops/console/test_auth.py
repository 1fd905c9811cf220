"""The console's roles and the identity proxy's headers (worker/ops/console/auth.py): what a header
may hold is bounded, whatever a client sends; who is an operator."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import SecretStr

from worker.config import ConsoleSettings
from worker.errors import ConfigError
from worker.ops.console.auth import (
    MAX_GROUPS,
    MAX_NAME_CHARS,
    GuessThrottle,
    Roles,
    TooManyGuesses,
    proxied_identity,
)
from worker.settings import load_console_settings

TOKEN = SecretStr("console-token-0123456789")


@given(st.text(max_size=2000), st.none() | st.text(max_size=5000))
def test_a_proxied_identity_is_bounded_or_refused_in_one_line(user: str, groups: str | None) -> None:
    try:
        name, member_of = proxied_identity(user, groups)
    except ValueError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("the identity proxy's")
        return
    assert 0 < len(name) <= MAX_NAME_CHARS and name.isprintable()
    assert len(member_of) <= MAX_GROUPS and all(0 < len(g) <= MAX_NAME_CHARS for g in member_of)


def test_groups_are_the_comma_separated_names() -> None:
    assert proxied_identity(" alice ", "dev, sre,,") == ("alice", frozenset({"dev", "sre"}))
    assert proxied_identity("alice", None) == ("alice", frozenset())


def roles(**settings: str) -> Roles:
    return Roles(ConsoleSettings(console_token=TOKEN, **settings))  # type: ignore[arg-type]


def test_without_roles_everyone_who_gets_in_is_an_operator() -> None:
    assert roles().operator("anyone") and roles().operator("token")


def test_with_roles_operators_are_the_names_and_the_groups_members() -> None:
    r = roles(console_operators="bob, token", console_operator_groups="sre")
    assert r.operator("bob") and r.operator("token") and r.operator("carol", frozenset({"dev", "sre"}))
    assert not r.operator("alice") and not r.operator("alice", frozenset({"dev"}))
    only_groups = roles(console_operator_groups="sre")
    assert not only_groups.operator("token") and only_groups.operator("x", frozenset({"sre"}))


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        (
            {"console_user_header": "X-Forwarded-User"},
            "TIMER_CONSOLE_TRUSTED_PROXIES: TIMER_CONSOLE_USER_HEADER needs the proxies' addresses",
        ),
        (
            {"console_user_header": "X-Forwarded-User", "console_trusted_proxies": "10.0.0.0/8, proxy.local"},
            "TIMER_CONSOLE_TRUSTED_PROXIES: not an address or network: 'proxy.local'",
        ),
        ({"console_groups_header": "X-Forwarded-Groups"}, "TIMER_CONSOLE_GROUPS_HEADER: needs"),
        (
            {"console_user_header": "X User", "console_trusted_proxies": "::1"},
            "TIMER_CONSOLE_USER_HEADER: not a",
        ),
    ],
)
def test_proxy_settings_that_would_trust_anyone_or_nothing_are_refused_in_one_line(
    settings: dict[str, str], said: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load_console_settings(console_token=TOKEN, **settings)
    assert str(refused.value).startswith(said) and "\n" not in str(refused.value)


def test_behind_a_proxy_the_console_needs_no_token() -> None:
    s = load_console_settings(console_user_header="X-Forwarded-User", console_trusted_proxies="127.0.0.1")
    assert s.console_token is None and [str(n) for n in s.trusted_proxies] == ["127.0.0.1/32"]


async def test_past_its_free_guesses_a_source_may_have_only_a_few_waiting_the_rest_refused_unchecked() -> (
    None
):
    now = [0.0]
    gate, holding = asyncio.Event(), asyncio.Event()

    async def held(_: float) -> None:  # a hold lasts until the test lets it go
        holding.set()
        await gate.wait()

    throttle = GuessThrottle(clock=lambda: now[0], sleep=held)
    throttle.FREE = 1
    checked: list[str] = []

    def wrong(name: str) -> Callable[[], None]:
        return lambda: checked.append(name)

    assert await asyncio.wait_for(throttle.check("s", wrong("first")), 1) is None  # free: at once
    waiting = [asyncio.create_task(throttle.check("s", wrong(f"w{i}"))) for i in range(throttle.MAX_WAITING)]
    await holding.wait()  # the first is held; the ready tasks ran in order up to their turn
    assert throttle.waiting("s") == throttle.MAX_WAITING
    with pytest.raises(TooManyGuesses) as refused:
        await throttle.check("s", lambda: "token")  # even a right one: it is not checked
    assert refused.value.retry_after_s >= 1
    assert await throttle.check("elsewhere", lambda: "token") == "token"  # another source: at once
    gate.set()
    await asyncio.gather(*waiting)
    assert checked == ["first", "w0", "w1"]
