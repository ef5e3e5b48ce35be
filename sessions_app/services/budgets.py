"""A session's budget: set it (budget/updated), read it with its spend.

`set_budget` validates (check), appends under the row lock (do), and wakes
the session on commit when it holds input, whose drive checks the budgets
anew. Profile budgets are the admin's (AgentProfile.daily_*), global ones
settings (TERRET_DAILY_*); the rules are runtime/limits.py's.
"""

from __future__ import annotations

import uuid
from decimal import Decimal, InvalidOperation
from typing import Any

from sessions_app import log
from sessions_app.errors import InvalidInput, UnknownSession
from sessions_app.log.catalogue import BUDGETS
from sessions_app.models import Session
from sessions_app.runtime import dispatch, limits

MAX_COST_USD = Decimal("1000000")
MAX_COUNT = 10**12


def check_budget(values: Any) -> dict[str, Any]:
    """The four limits as the log stores them; InvalidInput names the first bad one."""
    if not isinstance(values, dict):
        raise InvalidInput("a budget is an object with cost_usd, tokens, steps and turns (null: no limit)")
    unknown = sorted(set(values) - set(BUDGETS))
    if unknown:
        raise InvalidInput(f"unknown budget field {unknown[0]!r}; the fields are {', '.join(BUDGETS)}")
    out: dict[str, Any] = {}
    for name in BUDGETS:
        value = values.get(name)
        if value is None:
            out[name] = None
        elif name == "cost_usd":
            out[name] = float(_cost(value))
        elif isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            raise InvalidInput(f"{name} must be a whole number from 0 to {MAX_COUNT}, or null for no limit")
        else:
            out[name] = value
    return out


def _cost(value: Any) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidInput("cost_usd must be a number of US dollars, or null for no limit")
    try:
        cost = Decimal(str(value))
    except InvalidOperation:
        raise InvalidInput("cost_usd must be a number of US dollars, or null for no limit") from None
    if not cost.is_finite() or not 0 <= cost <= MAX_COST_USD:
        raise InvalidInput(f"cost_usd must be from 0 to {MAX_COST_USD}")
    return cost.quantize(Decimal("0.000001"))


def set_budget(session_id: uuid.UUID | str, values: Any, *, by: str = "") -> log.AppendedEvent:
    limits_ = check_budget(values)
    with log.locked(session_id) as tx:
        event = tx.append("budget/updated", {**limits_, "by": by} if by else limits_)
        if tx.row["held_seq"] is not None and tx.row["open_turn_seq"] is None:
            dispatch.wake(tx.session_id)  # on commit: its drive checks the budgets anew
    return event


def budget_of(session_id: uuid.UUID | str) -> dict[str, Any]:
    """{"limit": the session's four limits, "spent": the session's spend
    (and its unpriced entries), "exhausted": the first budget at any scope
    that keeps a new turn from starting, or None}."""
    session = Session.objects.select_related("profile").filter(id=session_id).first()
    if session is None:
        raise UnknownSession(f"no session {session_id}")
    spent, limit = limits.session_spent(session.id)
    over = limits.check(session.id, session.profile, opening=True)
    return {
        "limit": {name: (None if limit[name] is None else _number(name, limit[name])) for name in BUDGETS},
        "spent": {**{name: _number(name, spent.of(name)) for name in BUDGETS}, "unpriced": spent.unpriced},
        "exhausted": None if over is None else {**over.as_json(), "message": over.message},
    }


def _number(name: str, value: Any) -> float | int:
    return float(value) if name == "cost_usd" else int(value)
