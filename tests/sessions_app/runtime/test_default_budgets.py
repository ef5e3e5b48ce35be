"""Bounded by default (issue 31, point 3): a new profile's daily cost and
token budgets come from TERRET_PROFILE_DAILY_* and are enforced like any
profile budget; and on a model with no price, a scope that has a token
budget as well as a cost budget is bounded by the tokens instead of being
stopped at its first request. Requests are counted at the fake server."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Session
from sessions_app.runtime.drive import drive
from tests.fakes.fake_llm import Reply
from tests.helpers import edit_profile, events

pytestmark = pytest.mark.django_db(transaction=True)

UNPRICED = (10, 5, None)  # 15 tokens a request, no price


@pytest.fixture
def profile(db: None, settings: Any) -> AgentProfile:
    """A new profile under small default budgets: 40 tokens, $1 a day."""
    settings.TERRET_PROFILE_DAILY_TOKENS = 40
    settings.TERRET_PROFILE_DAILY_COST_USD = Decimal(1)
    return AgentProfile.objects.create(
        name="defaults", roles={"main": "test/model"}, builtin_tools=["debug.noop"], allow_floor=["*"]
    )


def noop_steps(n: int) -> list[Reply]:
    return [Reply(tool_calls=[("debug.noop", {})], usage=UNPRICED) for _ in range(n)]


@pytest.mark.usefixtures("manual_worker")
def test_a_new_profiles_default_token_budget_stops_a_runaway_turn(
    fake_llm: Any, session: Session, profile: AgentProfile
) -> None:
    assert (profile.daily_tokens, profile.daily_cost_usd) == (40, Decimal(1))
    fake_llm.script(*noop_steps(10))
    services.run_turn(session.id, "loop forever")
    assert drive(session.id) == "ended"
    end = events(session, "turn/end")[-1]
    assert end["status"] == "failed"
    # 15 tokens a step: 45 >= 40 after the third, so no fourth request is made.
    assert end["reason"] == {"budget": "tokens", "scope": "profile", "limit": 40, "spent": 45}
    assert len(fake_llm.requests) == 3
    receipt = services.inject(session.id, "more", wake=True)
    assert receipt.disposition == "held" and "daily token budget is exhausted" in (receipt.held_reason or "")


@pytest.mark.usefixtures("manual_worker")
def test_unpriced_spend_is_bounded_by_the_token_budget_beside_a_cost_budget(
    fake_llm: Any, session: Session, profile: AgentProfile
) -> None:
    fake_llm.script(*noop_steps(1), Reply(text="done", usage=UNPRICED))
    services.run_turn(session.id, "two steps")
    assert drive(session.id) == "ended"
    assert events(session, "turn/end")[-1] == {"status": "completed"}
    assert len(fake_llm.requests) == 2


@pytest.mark.usefixtures("manual_worker")
def test_a_cost_budget_alone_still_stops_unpriced_spend(fake_llm: Any, session: Session, profile: AgentProfile) -> None:
    edit_profile(profile, daily_tokens=None)
    fake_llm.script(*noop_steps(1), Reply(text="never", usage=UNPRICED))
    services.run_turn(session.id, "two steps")
    assert drive(session.id) == "ended"
    end = events(session, "turn/end")[-1]
    assert end["status"] == "failed"
    assert end["reason"] == {"budget": "cost_usd", "scope": "profile", "limit": 1.0, "spent": 0.0, "unpriced": 1}
    assert len(fake_llm.requests) == 1
