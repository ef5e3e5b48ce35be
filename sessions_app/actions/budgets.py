"""Budgets: a session's limits and spend."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from sessions_app.actions.access import by, session_for
from sessions_app.services import budgets as budget_services


@dataclass(frozen=True)
class Budget:
    """A session's four limits (None: no limit), its spend with its unpriced
    entries, and the first budget at any scope (session, profile per UTC
    day, global per UTC day) that keeps a new turn from starting (None when
    none does): services.budgets.budget_of's reading."""

    limit: dict[str, Any]
    spent: dict[str, Any]
    exhausted: dict[str, Any] | None

    def as_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "spent": self.spent, "exhausted": self.exhausted}


def budget_state(session_id: uuid.UUID) -> Budget:
    """`budget` for a socket that was allowed to read the session already."""
    return Budget(**budget_services.budget_of(session_id))


def budget(user: Any, session_id: Any) -> Budget:
    session = session_for(user, session_id, "view")
    return budget_state(session.id)


def set_budget(user: Any, session_id: Any, values: dict[str, Any]) -> Budget:
    """Replace the session's four limits (budget/updated; null: no limit);
    the budget as `budget` reads it afterwards."""
    session = session_for(user, session_id, "drive")
    budget_services.set_budget(session.id, values, by=by(user))
    return budget_state(session.id)
