from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sessions_app import log
from sessions_app.models import Event, Session
from tests.helpers import events, kinds

__all__ = ["count", "events", "kinds", "park"]


@pytest.fixture
def reviewer(make_reviewer: Callable[..., Any]) -> Any:
    return make_reviewer("rev")


def park(
    session_id: Any,
    call_id: str = "c1",
    name: str = "workspace.write",
    args: dict[str, Any] | None = None,
    *,
    new_turn: bool = True,
    deadline: dict[str, Any] | None = None,
) -> int:
    """Append a turn with an assistant call and its approval/requested (on
    the clock `deadline`, if given), as the loop would; returns the request's seq."""
    args = {"path": "a.txt", "content": "x"} if args is None else args
    with log.locked(session_id) as tx:
        if new_turn:
            tx.append("turn/start", {})
            tx.append("user/message", {"text": "go"})
            tx.append("step/start", {"step": 1, "model": "test/model"})
        tx.append(
            "assistant/message",
            {"content": None, "tool_calls": [{"id": call_id, "name": name, "arguments": json.dumps(args)}]},
        )
        request: dict[str, Any] = {"call_id": call_id, "name": name, "args": args}
        if deadline is not None:
            request["deadline"] = deadline
        return tx.append("approval/requested", request).seq


def count(session: Session) -> int:
    return Event.objects.filter(session=session).count()
