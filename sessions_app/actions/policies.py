"""Policies: a session's allow-list of tool patterns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies_app import services as policy_services
from sessions_app.actions.access import session_for


@dataclass(frozen=True)
class Policy:
    """A session's allow-list as set (its policy/updated event's seq)."""

    patterns: list[str]
    seq: int

    def as_json(self) -> dict[str, Any]:
        return {"patterns": self.patterns, "seq": self.seq}


def set_policy(user: Any, session_id: Any, patterns: list[str]) -> Policy:
    session = session_for(user, session_id, "drive")
    event = policy_services.update_policy(session.id, patterns, user=user)
    return Policy(list(event.data["patterns"]), event.seq)


def ask_again(user: Any, session_id: Any, tool: Any) -> int:
    """Undo a reviewer's "allow for this session" for `tool` (the owner,
    staff or a reviewer: policies_app.services.ask_again says who): its seq."""
    session = session_for(user, session_id, "view")
    return policy_services.ask_again(session.id, tool, user=user).seq
