"""Fixtures of the socket tests: a session of an owner with the owner's
token (`world`), and a real daphne server (`daphne`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.sessions_app.apiutil import new_session, token_for
from tests.sessions_app.liveserver import DaphneProcess


@pytest.fixture
def world(make_user: Any) -> dict[str, Any]:
    owner = make_user("owner")
    session = new_session(owner)
    return {"owner": owner, "sid": session.id, "token": token_for(owner)}


@pytest.fixture
def daphne(transactional_db: None) -> Iterator[DaphneProcess]:
    server = DaphneProcess().start()
    yield server
    server.kill()
