"""Forks: a new session of the caller's from a point of another's log."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import session_for
from sessions_app.models import Session
from sessions_app.services import forks as fork_services


def fork(user: Any, session_id: Any, at_seq: int, policy: str) -> Session:
    """A new session of the caller's from the parent's log as of at_seq
    (services/forks.py); reading the parent is enough. Doors shape it with
    services.forks.as_json."""
    parent = session_for(user, session_id, "view")
    return fork_services.fork(parent.id, at_seq, policy, user=user)


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
