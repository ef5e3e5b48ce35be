"""Helpers shared by the API, token and socket tests."""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.contrib.auth.models import Permission
from django.test import Client

from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session
from sessions_app.services.tokens import issue_token


def token_for(user: Any, name: str = "test") -> str:
    return issue_token(user, name)[1]


def bearer(token: str) -> dict[str, str]:
    return {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def make_reviewer(user: Any) -> Any:
    user.user_permissions.add(
        Permission.objects.get(codename="decide_approval", content_type__app_label="approvals_app")
    )
    return user


def demo() -> AgentProfile:
    """The data migration's demo profile (re-made after a transactional test's flush)."""
    from importlib import import_module

    from django.apps import apps

    import_module("sessions_app.migrations.0004_demo_profile").create_demo_profile(apps, None)
    return AgentProfile.objects.get(name="demo")


def new_session(owner: Any, *, spawned: bool = True) -> Session:
    """A demo session of `owner`; with `spawned` its live agent is spawned
    already (its log starts with agent/spawned, as tests/conftest.py's
    `session`), instead of by the runtime on its first drive."""
    profile = demo()
    session = services.create_session(owner, profile)
    if spawned:
        services.spawn_agent(session, profile)
    return session


def session_url(session: Session, tail: str = "") -> str:
    return f"/api/sessions/{session.id}{tail}"


def park_calls(session_id: uuid.UUID, *call_ids: str) -> None:
    """An open turn with `call_ids` waiting for approval, as the loop leaves it."""
    log.append(session_id, "turn/start", {"by": "test"})
    log.append(session_id, "user/message", {"text": "write two files"})
    calls = [
        {"id": cid, "name": "workspace.write", "arguments": json.dumps({"path": f"{cid}.txt", "text": "x"})}
        for cid in call_ids
    ]
    log.append(session_id, "assistant/message", {"content": None, "tool_calls": calls})
    for cid in call_ids:
        log.append(
            session_id,
            "approval/requested",
            {"call_id": cid, "name": "workspace.write", "args": {"path": f"{cid}.txt", "text": "x"}},
        )


def head(session_id: uuid.UUID | str) -> int:
    return Session.objects.get(id=session_id).last_seq


def event_count() -> int:
    return Event.objects.count()


def call(client: Client, method: str, url: str, body: Any = None, *, raw: str | None = None, **headers: Any) -> Any:
    """One JSON API request; returns the response (json body in .data)."""
    kwargs: dict[str, Any] = dict(headers)
    if raw is not None:
        kwargs.update(data=raw, content_type="application/json")
    elif body is not None:
        kwargs.update(data=json.dumps(body), content_type="application/json")
    response = getattr(client, method.lower())(url, **kwargs)
    response.data = response.json() if response.get("Content-Type", "").startswith("application/json") else None
    return response


def block_turn(session_id: uuid.UUID, reason: str = "the model provider failed: 503", attempts: int = 3) -> int:
    """An open turn that stopped retrying by itself, as the runtime leaves it
    (turn/start, its input, turn/blocked); the seq of its turn/blocked."""
    log.append(session_id, "turn/start", {"by": "test"})
    log.append(session_id, "user/message", {"text": "hello"})
    return log.append(session_id, "turn/blocked", {"reason": reason, "attempts": attempts}).seq
