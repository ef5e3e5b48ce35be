"""Budgets: a session's limits and spend."""

from __future__ import annotations

import uuid
from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.services import budgets as budget_services


def budget(user: Any, session_id: Any) -> dict[str, Any]:
    """The session's limits, its spend, and the first budget at any scope
    (session, profile per UTC day, global per UTC day) that keeps a new turn
    from starting (`exhausted`, None when none does)."""
    session = session_for(user, session_id, "view")
    return budget_services.budget_of(session.id)


def budget_state(session_id: uuid.UUID) -> dict[str, Any]:
    """`budget` for a socket that was allowed to read the session already."""
    return budget_services.budget_of(session_id)


def set_budget(user: Any, session_id: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Replace the session's four limits (budget/updated; null: no limit);
    the budget as `budget` reads it afterwards."""
    session = session_for(user, session_id, "drive")
    budget_services.set_budget(session.id, values, by=by(user))
    return budget_services.budget_of(session.id)
