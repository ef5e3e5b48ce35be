"""Forks: a new session of the caller's from a point of another's log."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import session_for
from sessions_app.models import Session
from sessions_app.services import forks as fork_services


def fork(user: Any, session_id: Any, at_seq: int, policy: str) -> dict[str, Any]:
    """A new session of the caller's from the parent's log as of at_seq
    (services/forks.py); reading the parent is enough."""
    parent = session_for(user, session_id, "view")
    child = fork_services.fork(parent.id, at_seq, policy, user=user)
    return fork_json(child)


def edit_and_resend(user: Any, session_id: Any, at_seq: int, text: str) -> Session:
    """A fork of the caller's just before the user message at `at_seq`, with
    `text` sent in its place (services/forks.py validates before forking)."""
    parent = session_for(user, session_id, "view")
    return fork_services.edit_and_resend(parent.id, at_seq, text, user=user)[0]


def regenerate(user: Any, session_id: Any, at_seq: int) -> Session:
    """A fork of the caller's at the turn of the assistant message at
    `at_seq`, asked again."""
    parent = session_for(user, session_id, "view")
    return fork_services.regenerate(parent.id, at_seq, user=user)


def fork_json(child: Session) -> dict[str, Any]:
    origin = fork_services.forked_from(child.id) or {}
    return {
        "id": str(child.id),
        "profile": child.profile.name if child.profile else None,
        "status": child.status,
        "parent": origin.get("parent"),
        "at_seq": origin.get("at_seq"),
        "requested_seq": origin.get("requested_seq"),
        "policy": origin.get("policy"),
        "last_seq": child.last_seq,
    }
