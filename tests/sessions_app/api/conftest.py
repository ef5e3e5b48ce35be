"""Fixtures of the API tests: the owner's bearer header and a session of theirs."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sessions_app.apiutil import bearer, new_session, token_for


@pytest.fixture
def auth(owner: Any) -> dict[str, str]:
    return bearer(token_for(owner))


@pytest.fixture
def session(owner: Any) -> Any:
    return new_session(owner)
