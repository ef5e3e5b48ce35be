"""Fixtures of the page tests: a session with its agent spawned (`chat`)."""

from __future__ import annotations

from typing import Any

import pytest

from sessions_app import services
from sessions_app.models import AgentProfile, Session


@pytest.fixture
def chat(owner: Any, profile: AgentProfile) -> Session:
    """A session with its agent spawned already (its log starts with agent/spawned)."""
    session = services.create_session(owner, profile)
    services.spawn_agent(session, profile)
    return session
