"""Operators' actions (the console): what needs a human, suspending and
resuming a scope, and abandon, revoke or restore of one session. Active
staff only: `operator(user)` for a scope, `session_for(.., "operate")` for a
session (a foreign or missing id is a 404 like on every other action)."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import by, operator, session_for
from sessions_app.models import Session
from sessions_app.services import operators


def attention(user: Any) -> dict[str, Any]:
    """What needs a human, by kind (operators.attention), and how many of each."""
    operator(user)
    found = operators.attention()
    return {
        "attention": {kind: [item.as_json() for item in items] for kind, items in found.items()},
        "counts": {kind: len(items) for kind, items in found.items()},
    }


def suspend(user: Any, scope: str, target: str, reason: str) -> dict[str, Any]:
    operator(user)
    operators.suspend(scope, target, by=by(user), reason=reason)
    return {"ok": True, "woken": None}


def resume(user: Any, scope: str, target: str, reason: str) -> dict[str, Any]:
    operator(user)
    woken = operators.resume(scope, target, by=by(user), reason=reason)
    return {"ok": True, "woken": woken}


SESSION_ACTIONS = {
    "retry": operators.retry,
    "abandon": operators.abandon,
    "revoke": operators.revoke,
    "restore": operators.restore,
}


def session_action(user: Any, session_id: Any, action: str, reason: str) -> dict[str, Any]:
    """retry or abandon (a blocked turn, NotBlocked / NotAbandonable 409
    otherwise), revoke or restore."""
    session = session_for(user, session_id, "operate")
    SESSION_ACTIONS[action](session.id, by=by(user), reason=reason)
    fresh = Session.objects.filter(id=session.id).first()
    return {"ok": True, "status": (fresh or session).status}
