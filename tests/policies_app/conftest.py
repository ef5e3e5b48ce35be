from __future__ import annotations

from collections.abc import Iterator

import pytest

from policies_app.selectors import cache
from sessions_app.models import AgentProfile


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="p",
        roles={"main": "test/model"},
        builtin_tools=["clock.now", "debug.noop", "workspace.read"],
        allow_floor=["clock.*"],
    )
