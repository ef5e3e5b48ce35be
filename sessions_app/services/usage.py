"""Cost and token usage: the running totals, the log's own sum, and display.

Page views read only the running totals the append transaction keeps: on the
Session row (per session) and in UsageDay (per profile per UTC day). Both are
written by the same statement that inserts the step/end or usage/recorded
event, so they cannot drift from the log. `log_sum` recomputes the figures
from the log itself; it scans a whole session and exists for tests and admin
consistency checks only, never for page views.

Compaction never resets anything: the figures are sums over the whole log,
compacted events included. A step or utility request the provider did not
price counts as "unpriced", never as $0.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import QuerySet, Sum
from django.utils import timezone

from sessions_app.models import Event, Session, UsageDay

USAGE_KINDS = ("step/end", "usage/recorded")


@dataclass(frozen=True)
class Totals:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: Decimal = Decimal(0)
    steps: int = 0
    unpriced: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": self.cost,
            "steps": self.steps,
            "unpriced": self.unpriced,
        }

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def cost_display(self) -> str:
        return format_cost(self.cost, self.unpriced)

    def __add__(self, other: Totals) -> Totals:
        return Totals(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cost + other.cost,
            self.steps + other.steps,
            self.unpriced + other.unpriced,
        )


def usage(session: Session) -> dict[str, Any]:
    """Lifetime usage of one session from its running totals (no log scan):
    {prompt_tokens, completion_tokens, cost, steps, unpriced}. `cost` is a
    Decimal covering the priced entries only; `unpriced` counts the rest."""
    return totals_of(session).as_dict()


def totals_of(row: Session | UsageDay | Mapping[str, Any]) -> Totals:
    get = row.get if isinstance(row, Mapping) else lambda name: getattr(row, name)
    return Totals(
        int(get("prompt_tokens") or 0),
        int(get("completion_tokens") or 0),
        Decimal(get("cost") or 0),
        int(get("steps") or 0),
        int(get("unpriced_entries") or 0),
    )


def format_cost(cost: Decimal | float | int, unpriced: int) -> str:
    """Display text: $0.0123, or $0.0123 + 2 unpriced. The priced part always
    shows, and the unpriced calls are counted beside it, so an unknown price
    neither reads as $0 nor hides what is known (issue 34)."""
    amount = Decimal(str(cost))
    text = f"${amount:.4f}"
    return f"{text} + {unpriced} unpriced" if unpriced else text


def entry_totals(kind: str, data: dict[str, Any]) -> Totals:
    """What one step/end or usage/recorded event adds (mirrors the catalogue's projection)."""
    if kind not in USAGE_KINDS:
        return Totals()
    steps = 1 if kind == "step/end" else 0
    figure = data.get("usage")
    if figure is None:
        # A step/end whose request a usage/recorded counted already adds only the step.
        return Totals(steps=steps, unpriced=0 if data.get("usage_recorded") else 1)
    cost = figure.get("cost")
    return Totals(
        int(figure["prompt_tokens"]),
        int(figure["completion_tokens"]),
        Decimal(0) if cost is None else Decimal(str(cost)),
        steps,
        1 if cost is None else 0,
    )


def sum_entries(rows: Iterable[tuple[str, dict[str, Any]]]) -> Totals:
    total = Totals()
    for kind, data in rows:
        total = total + entry_totals(kind, data)
    return total


def log_sum(session_id: uuid.UUID | str) -> Totals:
    """Recompute a session's usage from its log: every step/end and
    usage/recorded, compacted or not. Scans the session; tests/admin only."""
    rows = (
        Event.objects.filter(session_id=session_id, kind__in=USAGE_KINDS)
        .order_by("seq")
        .values_list("kind", "data")
        .iterator(chunk_size=2000)
    )
    return sum_entries(rows)


def log_sum_by_day(session_ids: Iterable[uuid.UUID | str]) -> dict[date, Totals]:
    """Per-UTC-day sums over the given sessions' logs (tests/admin checks of UsageDay)."""
    out: dict[date, Totals] = {}
    rows = (
        Event.objects.filter(session_id__in=list(session_ids), kind__in=USAGE_KINDS)
        .values_list("kind", "data", "created_at")
        .iterator(chunk_size=2000)
    )
    for kind, data, at in rows:
        day = at.date()
        out[day] = out.get(day, Totals()) + entry_totals(kind, data)
    return out


def check_session(session_id: uuid.UUID | str) -> tuple[bool, Totals, Totals]:
    """(consistent, running totals, log sum) for one session."""
    session = Session.objects.get(id=session_id)
    running, summed = totals_of(session), log_sum(session_id)
    return same_totals(running, summed), running, summed


def same_totals(a: Totals, b: Totals) -> bool:
    # Costs are compared at the column's precision (10 decimal places).
    q = Decimal("1e-10")
    return (a.prompt_tokens, a.completion_tokens, a.steps, a.unpriced, a.cost.quantize(q)) == (
        b.prompt_tokens,
        b.completion_tokens,
        b.steps,
        b.unpriced,
        b.cost.quantize(q),
    )


# ---------------------------------------------------------------- dashboard reads (running totals only)

_SUMS = {
    "steps": Sum("steps"),
    "unpriced_entries": Sum("unpriced_entries"),
    "prompt_tokens": Sum("prompt_tokens"),
    "completion_tokens": Sum("completion_tokens"),
    "cost": Sum("cost"),
}


@dataclass(frozen=True)
class DayPoint:
    day: date
    cost: Decimal
    unpriced: int
    steps: int
    tokens: int

    @property
    def cost_display(self) -> str:
        return format_cost(self.cost, self.unpriced)


def profile_totals_from_days() -> list[tuple[str, Totals]]:
    """All-time totals per profile, from UsageDay (one row per profile per day)."""
    rows = UsageDay.objects.values("profile__name").annotate(**_SUMS).order_by("profile__name")
    return [(row["profile__name"] or "(no profile)", totals_of(row)) for row in rows]


def profile_totals_from_sessions(sessions: QuerySet[Session]) -> list[tuple[str, Totals]]:
    """Totals per profile over the given sessions' running totals (one row each, no log)."""
    rows = sessions.order_by().values("profile__name").annotate(**_SUMS).order_by("profile__name")
    return [(row["profile__name"] or "(no profile)", totals_of(row)) for row in rows]


def day_series(days: int, today: date | None = None) -> list[DayPoint]:
    """Cost per UTC day for the last `days` days, oldest first, gaps filled with zeros."""
    end = today or timezone.now().date()
    start = end - timedelta(days=days - 1)
    rows = UsageDay.objects.filter(day__gte=start, day__lte=end).values("day").annotate(**_SUMS)
    by_day = {row["day"]: totals_of(row) for row in rows}
    out = []
    for i in range(days):
        day = start + timedelta(days=i)
        t = by_day.get(day, Totals())
        out.append(DayPoint(day, t.cost, t.unpriced, t.steps, t.tokens))
    return out
