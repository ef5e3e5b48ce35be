"""Effects: a session's effect ledger, and an operator's answer to an
attempt of unknown outcome. The verbs return the ledger's `Effect` values;
each door shapes them (`Effect.as_json` is the one JSON shape)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.models import Session
from sessions_app.services import effects as effect_services
from sessions_app.services.effects import Effect


@dataclass(frozen=True)
class Resolved:
    """The attempt as it was answered, and the session's status after it."""

    effect: Effect
    status: str


def effects(user: Any, session_id: Any) -> list[Effect]:
    """The session's effect ledger: every attempt, oldest first."""
    session = session_for(user, session_id, "view")
    return list(effect_services.effects(session.id))


def resolve(
    user: Any, session_id: Any, call_id: str, action: str, result: str | None = None, reason: str | None = None
) -> Resolved:
    """Answer the newest unknown attempt of `call_id` (effect_services.resolve)."""
    session = session_for(user, session_id, "resolve")
    effect = effect_services.resolve(session.id, call_id, action, result=result or "", reason=reason or "", by=by(user))
    fresh = Session.objects.filter(id=session.id).first()
    return Resolved(effect, (fresh or session).status)
