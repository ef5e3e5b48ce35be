from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from policies_app.selectors import cache
from sessions_app import services
from sessions_app.models import AgentProfile, Session


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    # Every actor is a real user with a password; PBKDF2 would dominate these tests.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="p",
        roles={"main": "test/model"},
        builtin_tools=["clock.now", "debug.noop", "workspace.read"],
        allow_floor=["clock.*"],
    )


@pytest.fixture
def session(make_user: Any, profile: AgentProfile) -> Session:
    return services.create_session(make_user("owner"), profile)
