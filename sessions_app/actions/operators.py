"""Operators' actions (the console): what needs a human, suspending and
resuming a scope, and abandon, revoke or restore of one session. Active
staff only: `operator(user)` for a scope, `session_for(.., "operate")` for a
session (a foreign or missing id is a 404 like on every other action)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sessions_app.actions.access import by, operator, session_for
from sessions_app.actions.sessions import StatusAfter, status_now
from sessions_app.services import operators
from sessions_app.services.operators import Item as AttentionItem


@dataclass(frozen=True)
class Attention:
    """What needs a human, by kind (operators.attention), each bounded."""

    items: dict[str, list[AttentionItem]]

    @property
    def counts(self) -> dict[str, int]:
        return {kind: len(found) for kind, found in self.items.items()}

    def as_json(self) -> dict[str, Any]:
        return {
            "attention": {kind: [item.as_json() for item in found] for kind, found in self.items.items()},
            "counts": self.counts,
        }


@dataclass(frozen=True)
class ScopeChange:
    """A suspension or its lifting; `woken`: resume only, the held sessions woken."""

    woken: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {"ok": True, "woken": self.woken}


def attention(user: Any) -> Attention:
    operator(user)
    return Attention(operators.attention())


def suspend(user: Any, scope: str, target: str, reason: str) -> ScopeChange:
    operator(user)
    operators.suspend(scope, target, by=by(user), reason=reason)
    return ScopeChange()


def resume(user: Any, scope: str, target: str, reason: str) -> ScopeChange:
    operator(user)
    return ScopeChange(operators.resume(scope, target, by=by(user), reason=reason))


SESSION_ACTIONS = {
    "retry": operators.retry,
    "abandon": operators.abandon,
    "revoke": operators.revoke,
    "restore": operators.restore,
}


def session_action(user: Any, session_id: Any, action: str, reason: str) -> StatusAfter:
    """retry or abandon (a blocked turn, NotBlocked / NotAbandonable 409
    otherwise), revoke or restore: the session's status afterwards."""
    session = session_for(user, session_id, "operate")
    SESSION_ACTIONS[action](session.id, by=by(user), reason=reason)
    return StatusAfter(status_now(session), {"ok": True})
