"""A session's budget: set it (budget/updated), read it with its spend.

`set_budget` validates (check), appends under the row lock (do), and wakes
the session on commit when it holds input, whose drive checks the budgets
anew. Profile budgets are the admin's (AgentProfile.daily_*), global ones
settings (TERRET_DAILY_*); the rules are runtime/limits.py's.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from django.db.models import Q, Sum
from django.utils import timezone

from sessions_app import log
from sessions_app.errors import InvalidInput, UnknownSession
from sessions_app.log.catalogue import BUDGETS
from sessions_app.models import AgentProfile, Session, UsageDay
from sessions_app.runtime import dispatch, limits
from sessions_app.services.usage import format_cost

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
    below = limits.children_spent(session.id)
    children = {"cost_usd": float(below.cost_usd), "tokens": below.tokens}
    return {
        "limit": {name: (None if limit[name] is None else _number(name, limit[name])) for name in BUDGETS},
        "spent": {
            **{name: _number(name, spent.of(name)) for name in BUDGETS},
            "unpriced": spent.unpriced,
            "children": children,
        },
        "exhausted": None if over is None else {**over.as_json(), "message": over.message},
    }


def _number(name: str, value: Any) -> float | int:
    return float(value) if name == "cost_usd" else int(value)


# ---------------------------------------------------------------- display (the dashboard)

_LABELS = {"cost_usd": "cost", "tokens": "tokens", "steps": "steps", "turns": "turns"}


@dataclass(frozen=True)
class BudgetLine:
    """One set limit beside its spend, as text; exhausted by runtime/limits.py's rules."""

    budget: str
    spent: str
    limit: str
    exhausted: bool

    @property
    def text(self) -> str:
        return f"{_LABELS[self.budget]} {self.spent} / {self.limit}"


@dataclass(frozen=True)
class BudgetView:
    """Spent against limit at one scope (a session, a profile's day, the installation's day)."""

    scope: str
    name: str
    lines: tuple[BudgetLine, ...]

    @property
    def exhausted(self) -> bool:
        return any(line.exhausted for line in self.lines)

    @property
    def text(self) -> str:
        return " · ".join(line.text for line in self.lines)

    def __bool__(self) -> bool:
        return bool(self.lines)


def _limit_text(name: str, limit: Decimal | int) -> str:
    if name != "cost_usd":
        return str(limit)
    amount = Decimal(limit)
    if amount == amount.quantize(Decimal("0.01")):
        return f"${amount:.2f}"
    return f"${amount.normalize():f}"


def budget_view(scope: str, name: str, limits_: dict[str, Decimal | int | None], spent: limits.Spent) -> BudgetView:
    """The limits that are set (only those), each with its spend: a turn could
    not start against an exhausted one (limits.first_exceeded, opening)."""
    lines = []
    for budget in BUDGETS:
        limit = limits_.get(budget)
        if limit is None:
            continue
        over = limits.first_exceeded(scope, {budget: limit}, spent, opening=True) is not None
        used = format_cost(spent.cost_usd, spent.unpriced) if budget == "cost_usd" else str(spent.of(budget))
        lines.append(BudgetLine(budget, used, _limit_text(budget, limit), over))
    return BudgetView(scope, name, tuple(lines))


def session_budget(session: Session) -> BudgetView:
    """A session's budget from the row already read (no query)."""
    row = {field: getattr(session, field) for field in (*_ROW_FIELDS, *(f"budget_{n}" for n in BUDGETS))}
    return budget_view("session", session.title, limits.limits_of_session(row), _spent_of(row))


_ROW_FIELDS = ("cost", "prompt_tokens", "completion_tokens", "steps", "turns", "unpriced_entries")


def _spent_of(row: Mapping[str, Any]) -> limits.Spent:
    return limits.Spent(
        Decimal(row.get("cost") or 0),
        int(row.get("prompt_tokens") or 0) + int(row.get("completion_tokens") or 0),
        int(row.get("steps") or 0),
        int(row.get("turns") or 0),
        int(row.get("unpriced_entries") or 0),
    )


def daily_budgets(profile_names: Iterable[str] | None = None, *, include_global: bool) -> list[BudgetView]:
    """Today's (UTC) spend against the daily limits that are set: per profile
    (those named, or every one when None) and, when asked, the installation's.
    Two queries at most, however many profiles."""
    profiles = AgentProfile.objects.filter(
        Q(daily_cost_usd__isnull=False)
        | Q(daily_tokens__isnull=False)
        | Q(daily_steps__isnull=False)
        | Q(daily_turns__isnull=False)
    ).order_by("name")
    if profile_names is not None:
        profiles = profiles.filter(name__in=list(profile_names))
    budgeted = list(profiles)
    global_limits = limits.global_limits()
    with_global = include_global and any(v is not None for v in global_limits.values())
    if not budgeted and not with_global:
        return []
    rows = (
        UsageDay.objects.filter(day=timezone.now().date())
        .values("profile_id")
        .annotate(
            cost=Sum("cost"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            steps=Sum("steps"),
            turns=Sum("turns"),
            unpriced_entries=Sum("unpriced_entries"),
        )
    )
    by_profile = {row["profile_id"]: _spent_of(row) for row in rows.order_by()}
    out = [
        budget_view("profile", p.name, limits.limits_of_profile(p), by_profile.get(p.pk, limits.NOTHING))
        for p in budgeted
    ]
    if with_global:
        total = sum(by_profile.values(), limits.NOTHING)
        out.append(budget_view("global", "All sessions", global_limits, total))
    return out
