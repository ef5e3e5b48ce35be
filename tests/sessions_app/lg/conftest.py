"""Fixtures of the LangGraph door's tests: a profile whose model is FakeLLM's,
an owner who is also a reviewer (so one token may resume interrupts), and
their token."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app.models import AgentProfile
from tests.sessions_app.apiutil import make_reviewer, token_for

PROFILE = "lgtest"


@pytest.fixture
def lg_profile(db: None) -> AgentProfile:
    """workspace.write asks for approval (it mutates); clock.now does not."""
    return AgentProfile.objects.create(
        name=PROFILE,
        description="LangGraph door tests",
        roles={"main": "test/model"},
        builtin_tools=["clock.now", "workspace.write", "workspace.read"],
        allow_floor=["*"],
    )


@pytest.fixture
def lg_user(make_user: Any, lg_profile: AgentProfile) -> Any:
    return make_reviewer(make_user("lg-owner"))


@pytest.fixture
def lg_token(lg_user: Any) -> str:
    return token_for(lg_user)
