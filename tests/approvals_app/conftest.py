from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Group, Permission

from sessions_app import log, services
from sessions_app.models import AgentProfile, Event, Session


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    # Every actor is a real user with a password; PBKDF2 would dominate these tests.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def profile(db: None) -> AgentProfile:
    return AgentProfile.objects.create(
        name="t",
        roles={"main": "test/model"},
        builtin_tools=["workspace.write", "workspace.read", "clock.now", "debug.noop"],
        allow_floor=["*"],
    )


@pytest.fixture
def session(make_user: Any, profile: AgentProfile) -> Session:
    return services.create_session(make_user("owner"), profile)


@pytest.fixture
def make_reviewer(make_user: Any) -> Callable[..., Any]:
    """A user in the "reviewers" group (approvals_app's migration creates it;
    transactional tests flush it away, so it is re-made here the same way)."""

    def make(username: str | None = None, **kwargs: Any) -> Any:
        user = make_user(username, **kwargs)
        group, _ = Group.objects.get_or_create(name="reviewers")
        group.permissions.add(
            Permission.objects.get(content_type__app_label="approvals_app", codename="decide_approval")
        )
        user.groups.add(group)
        return user

    return make


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
) -> int:
    """Append a turn with an assistant call and its approval/requested, as the
    loop would; returns the request's seq."""
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
        return tx.append("approval/requested", {"call_id": call_id, "name": name, "args": args}).seq


def kinds(session: Session) -> list[str]:
    return list(Event.objects.filter(session=session).order_by("seq").values_list("kind", flat=True))


def events(session: Session, kind: str) -> list[dict[str, Any]]:
    return list(Event.objects.filter(session=session, kind=kind).order_by("seq").values_list("data", flat=True))


def count(session: Session) -> int:
    return Event.objects.filter(session=session).count()
