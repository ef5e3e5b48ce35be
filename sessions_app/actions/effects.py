"""Effects: a session's effect ledger, and an operator's answer to an
attempt of unknown outcome."""

from __future__ import annotations

from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.models import Session
from sessions_app.services import effects as effect_services


def effects(user: Any, session_id: Any) -> dict[str, Any]:
    """The session's effect ledger: every attempt, oldest first, and how many
    wait for an operator (state unknown)."""
    session = session_for(user, session_id, "view")
    rows = effect_services.effects(session.id)
    return {"effects": [e.as_json() for e in rows], "pending": sum(1 for e in rows if e.state == "unknown")}


def resolve(
    user: Any, session_id: Any, call_id: str, action: str, result: str | None = None, reason: str | None = None
) -> dict[str, Any]:
    """Answer the newest unknown attempt of `call_id` (effect_services.resolve):
    the attempt as it was, and the session's status after it."""
    session = session_for(user, session_id, "resolve")
    effect = effect_services.resolve(session.id, call_id, action, result=result or "", reason=reason or "", by=by(user))
    fresh = Session.objects.filter(id=session.id).first()
    return {"resolved": effect.as_json(), "status": (fresh or session).status}
