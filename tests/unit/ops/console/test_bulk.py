"""The console's bulk actions (worker/ops/console/bulk.py): which ones a filter may offer, and a
confirmation good for one send, bounded whatever is asked."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from worker.ops.console.bulk import (
    CONFIRM_COUNT_CAP,
    CONFIRMATION_TTL_S,
    OFFER_COUNT_CAP,
    Asked,
    Confirmations,
    offers,
)
from worker.ops.reads import STATES


def asked(user: str = "bob", what: str = "cancel", state: str | None = None, count: int = 3) -> Asked:
    return Asked(user, what, "acme", (("campaign", "bf"),), state, count)


def test_an_action_is_offered_only_where_the_label_path_acts_on_exactly_the_filtered_timers() -> None:
    assert offers(None, tenant_paused=False) == (("cancel", "pause", "resume"), None)
    assert offers(None, tenant_paused=True)[0] == ("cancel", "pause", "resume")
    assert offers("Scheduled", tenant_paused=False)[0] == ("pause",)
    assert offers("Paused", tenant_paused=False)[0] == ("resume",)
    assert offers("Paused", tenant_paused=True)[0] == ("resume",)
    # The tenant's paused timers would gain a pause of their own, which outlasts its resume.
    assert offers("Scheduled", tenant_paused=True)[0] == ()
    for final in ("Reached", "Cancelled", "Expired"):
        whats, why = offers(final, tenant_paused=False)
        assert whats == () and why == f"{final} timers are final: no command changes them."


@given(st.sampled_from([None, *STATES]), st.booleans())
def test_whatever_is_not_offered_is_said_why_in_one_line(state: str | None, paused: bool) -> None:
    whats, why = offers(state, paused)
    assert set(whats) <= {"cancel", "pause", "resume"}
    if len(whats) < 3:
        assert why and "\n" not in why
    if state is not None:
        assert "cancel" not in whats, "a cancel by label takes Scheduled and Paused alike"


def test_a_confirmation_sends_once_for_its_user_and_its_action() -> None:
    kept = Confirmations()
    token = kept.give(asked(count=7))
    assert kept.use(token, asked(user="mallory", count=0)) is None
    assert kept.use(token, asked(what="pause", count=0)) is None
    assert kept.use(token, asked(state="Scheduled", count=0)) is None
    used = kept.use(token, asked(count=0))
    assert used is not None and used.count == 7  # the count the confirmation showed
    assert kept.use(token, asked(count=0)) is None  # posted again: nothing
    assert kept.use("made-up", asked(count=0)) is None


def test_a_confirmation_expires() -> None:
    now = [0.0]
    kept = Confirmations(ttl_s=60.0, clock=lambda: now[0])
    old, fresh = kept.give(asked()), None
    now[0] = 30.0
    fresh = kept.give(asked())
    now[0] = 61.0
    assert kept.use(old, asked()) is None and kept.use(fresh, asked()) is not None


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40)), max_size=300), st.integers(1, 20))
def test_confirmations_kept_stay_bounded_and_each_sends_at_most_once(
    steps: list[tuple[bool, int]], most: int
) -> None:
    kept = Confirmations(kept=most)
    tokens: list[str] = []
    sent: list[str] = []
    for give, pick in steps:
        if give or not tokens:
            tokens.append(kept.give(asked()))
        elif kept.use(tokens[pick % len(tokens)], asked()) is not None:
            sent.append(tokens[pick % len(tokens)])
        assert len(kept) <= most
    assert len(sent) == len(set(sent))


def test_the_operations_guide_says_the_bounds_the_code_keeps() -> None:
    guide = " ".join((Path(__file__).parents[4] / "docs" / "OPERATIONS.md").read_text().split())
    assert f"counted up to {OFFER_COUNT_CAP:,} on the page" in guide
    assert f"how many timers it matches now (up to {CONFIRM_COUNT_CAP:,})" in guide
    assert f"forgotten after {CONFIRMATION_TTL_S / 60:.0f} minutes" in guide
