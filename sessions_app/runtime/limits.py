"""Budgets, and operators' holds: what keeps a session from spending.

Holds come first: an operator's suspension of admission (the session's own
session/suspended, or a Suspension row for its profile or for everything)
keeps new turns from starting and parks a running turn at its next step
boundary. Every worker reads the Suspension rows at most a second old.

Budgets are hard ceilings on what a session, a profile per UTC day, and the
whole installation per UTC day may spend.

Four budgets at each level: cost (USD), tokens (prompt plus completion),
model steps and turns. Spent is the log's running totals: the Session row
(kept by every append) for a session, the sum of a profile's UsageDay rows
of the day (one per tally shard, TERRET_TALLY_SHARDS) for a profile's day
and the sum of today's UsageDay rows for the installation. Utility requests (the
titler, the summarizer) and the spend of requests whose reply never
committed count like any step (usage/recorded).

When a budget is checked, and what the next action would add:
- before a turn opens (admission: `opening=True`): the turn itself, one step;
- before every model call inside a turn (`opening=False`): one step.
A budget is exhausted when the spend has reached its limit, or the next
action would pass it: tokens and cost at spent >= limit, steps at
steps + 1 > limit, turns at turns (+1 when opening) > limit.

Concurrent turns of one profile (or of the installation): a check reads
committed spend only and takes no lock, so a step that passed its check
is not counted by another turn's check until its step/end commits. A
daily budget can therefore be passed by at most the steps in flight when
its spend reached the limit, one per turn running in that scope: steps by
at most (running turns - 1), cost and tokens by what those steps spend;
turns by at most (turns opened at once - 1). That bound is the same with
one tally row or several (TERRET_TALLY_SHARDS): the rows only split the
writes, and every read sums them (tests/sessions_app/runtime/test_hot_profile.py).

Unpriced spend under a cost budget: a cost budget cannot be enforced on a
request whose price is unknown, and unpriced is never $0, so a cost budget
counts as exhausted as soon as its scope has an unpriced entry (`unpriced`
in the reason): remove or raise nothing will help but a priced model, a
budget without a cost limit, or an operator's decision. Unless the same
scope has a token budget too: that one bounds the unpriced spend, and the
cost budget counts the priced spend only. (Every new profile has both by
default, TERRET_PROFILE_DAILY_*, so a profile on a model with no price is
bounded by its tokens rather than stopped at its first request.)

A profile's daily limits are its live row's at every check, whatever
agent version the turn runs (runtime/versions.py): the day's spend is one
pool for the sessions of every version.

The checks read nothing when no budget applies: session limits are known
from the lease claim's row (Driving.budgeted) and from the turn's view
(budget/updated), profile limits from the profile, global ones from
settings.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from sessions_app.log.catalogue import BUDGETS
from sessions_app.models import AgentProfile, Session, Suspension, Task, UsageDay

_NAMES = {"cost_usd": "cost", "tokens": "token", "steps": "step", "turns": "turn"}
_SCOPES = {"session": "the session's", "profile": "the profile's daily", "global": "the daily global"}


@dataclass(frozen=True)
class Spent:
    cost_usd: Decimal
    tokens: int
    steps: int
    turns: int
    unpriced: int

    def of(self, budget: str) -> Decimal | int:
        value: Decimal | int = getattr(self, budget)
        return value

    def __add__(self, other: Spent) -> Spent:
        return Spent(
            self.cost_usd + other.cost_usd,
            self.tokens + other.tokens,
            self.steps + other.steps,
            self.turns + other.turns,
            self.unpriced + other.unpriced,
        )


NOTHING = Spent(Decimal(0), 0, 0, 0, 0)


def buffered(entries: list[tuple[str, dict[str, Any]]]) -> Spent:
    """What appends not yet committed will add (a turn's outbox between two
    steps holds the last step's step/end): the projection's own rules."""
    total = NOTHING
    for kind, data in entries:
        if kind not in ("step/end", "usage/recorded"):
            continue
        usage = data.get("usage")
        steps = 1 if kind == "step/end" else 0
        if usage is None:
            unpriced = 0 if kind == "step/end" and data.get("usage_recorded") else 1
            total = total + Spent(Decimal(0), 0, steps, 0, unpriced)
            continue
        cost = usage.get("cost")
        tokens = int(usage["prompt_tokens"]) + int(usage["completion_tokens"])
        priced = Decimal(str(cost)) if cost is not None else Decimal(0)
        total = total + Spent(priced, tokens, steps, 0, 1 if cost is None else 0)
    return total


@dataclass(frozen=True)
class Exceeded:
    """Which budget stops the spend, at which scope, its limit and the spend."""

    budget: str
    scope: str
    limit: Decimal | int
    spent: Decimal | int
    unpriced: int = 0

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "budget": self.budget,
            "scope": self.scope,
            "limit": float(self.limit) if self.budget == "cost_usd" else int(self.limit),
            "spent": float(self.spent) if self.budget == "cost_usd" else int(self.spent),
        }
        if self.unpriced:
            out["unpriced"] = self.unpriced
        return out

    @property
    def message(self) -> str:
        what = f"{_SCOPES[self.scope]} {_NAMES[self.budget]} budget"
        if self.unpriced:
            return (
                f"{what} (${self.limit}) cannot be enforced: {self.unpriced} unpriced "
                f"{'entry' if self.unpriced == 1 else 'entries'} (unpriced is never counted as $0)"
            )
        if self.budget == "cost_usd":
            return f"{what} is exhausted: ${self.spent:.4f} of ${self.limit}"
        return f"{what} is exhausted: {self.spent} of {self.limit}"


@dataclass(frozen=True)
class Hold:
    """An operator's suspension of admission, at its scope."""

    scope: str
    by: str = ""
    why: str = ""
    target: str = ""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hold": "suspended", "scope": self.scope}
        if self.by:
            out["by"] = self.by
        return out

    @property
    def message(self) -> str:
        where = {"session": "this session", "profile": f"the profile {self.target}", "global": "every session"}
        text = f"admission is suspended for {where[self.scope]}"
        if self.by:
            text += f" by {self.by}"
        return f"{text}: {self.why}" if self.why else text


Stop = Exceeded | Hold
SUSPENSIONS_TTL_SECONDS = 1.0
_suspensions: tuple[float, dict[tuple[str, str], tuple[str, str]]] = (-1e9, {})
_suspensions_lock = threading.Lock()


def suspensions() -> dict[tuple[str, str], tuple[str, str]]:
    """{(scope, target): (by, reason)} of the profile and global suspensions,
    read again when this process's copy is a second old."""
    global _suspensions
    now = time.monotonic()
    with _suspensions_lock:
        at, rows = _suspensions
    if now - at < SUSPENSIONS_TTL_SECONDS:
        return rows
    fresh = {(s, t): (b, r) for s, t, b, r in Suspension.objects.values_list("scope", "target", "by", "reason")}
    with _suspensions_lock:
        _suspensions = (now, fresh)
    return fresh


def forget_suspensions() -> None:
    """Read the Suspension rows afresh next time (after this process changed them)."""
    global _suspensions
    with _suspensions_lock:
        _suspensions = (-1e9, {})


def hold_of(profile: AgentProfile | None, *, suspended: bool) -> Hold | None:
    """The suspension holding this session, if any: its own (the caller
    knows it from the row), its profile's, or everything's."""
    if suspended:
        return Hold("session")
    found = suspensions()
    if ("global", "") in found:
        by, why = found[("global", "")]
        return Hold("global", by, why)
    if profile is not None and ("profile", profile.name) in found:
        by, why = found[("profile", profile.name)]
        return Hold("profile", by, why, profile.name)
    return None


def limits_of_session(row: dict[str, Any]) -> dict[str, Decimal | int | None]:
    return {name: row.get(f"budget_{name}") for name in BUDGETS}


def limits_of_profile(profile: AgentProfile | None) -> dict[str, Decimal | int | None]:
    if profile is None:
        return dict.fromkeys(BUDGETS)
    return {name: getattr(profile, f"daily_{name}") for name in BUDGETS}


def global_limits() -> dict[str, Decimal | int | None]:
    return {name: getattr(settings, f"TERRET_DAILY_{name.upper()}", None) for name in BUDGETS}


def _any(limits: dict[str, Any]) -> bool:
    return any(v is not None for v in limits.values())


_SESSION_FIELDS = ("cost", "prompt_tokens", "completion_tokens", "steps", "turns", "unpriced_entries")


def _spent(values: dict[str, Any]) -> Spent:
    return Spent(
        Decimal(values.get("cost") or 0),
        int(values.get("prompt_tokens") or 0) + int(values.get("completion_tokens") or 0),
        int(values.get("steps") or 0),
        int(values.get("turns") or 0),
        int(values.get("unpriced_entries") or 0),
    )


def session_spent(session_id: uuid.UUID | str) -> tuple[Spent, dict[str, Decimal | int | None]]:
    fields = (*_SESSION_FIELDS, *(f"budget_{n}" for n in BUDGETS))
    row = Session.objects.filter(id=session_id).values(*fields).first() or {}
    return _spent(row), limits_of_session(row)


# Subagents (runtime/owned/): a child's cost and tokens count against its
# parent's (and every ancestor's) session budget; its steps and turns are its own.
TREE_BUDGETS = ("cost_usd", "tokens")
MAX_TREE_DEPTH = 16  # a walk up or down the tree stops here, whatever the rows say


# check()'s `parent` when the caller has not read the session's row.
UNREAD: Any = object()


def ancestors(session_id: uuid.UUID | str, parent: Any = UNREAD) -> list[uuid.UUID]:
    """The sessions owning this one through subagent tasks, nearest first.
    `parent` is the session's parent_session_id when the caller read its row
    (None: a root, which costs no query)."""
    out: list[uuid.UUID] = []
    if parent is UNREAD:
        parent = Session.objects.filter(id=session_id).values_list("parent_session_id", flat=True).first()
    for _ in range(MAX_TREE_DEPTH):
        if parent is None or parent in out:
            break
        out.append(parent)
        parent = Session.objects.filter(id=parent).values_list("parent_session_id", flat=True).first()
    return out


def descendants(session_id: uuid.UUID | str) -> list[uuid.UUID]:
    """Every child session under this one, at any depth."""
    out: list[uuid.UUID] = []
    frontier: list[Any] = [session_id]
    for _ in range(MAX_TREE_DEPTH):
        children = list(
            Task.objects.filter(session_id__in=frontier, child_session__isnull=False).values_list(
                "child_session_id", flat=True
            )
        )
        children = [c for c in children if c is not None and c not in out]
        if not children:
            break
        out.extend(children)
        frontier = children
    return out


def children_spent(session_id: uuid.UUID | str) -> Spent:
    """What the session's subagents (at any depth) spent: cost, tokens and
    unpriced entries (their steps and turns count against their own budgets only)."""
    below = descendants(session_id)
    if not below:
        return NOTHING
    total = NOTHING
    for row in Session.objects.filter(id__in=below).values(*_SESSION_FIELDS):
        mine = _spent(row)
        total += Spent(mine.cost_usd, mine.tokens, 0, 0, mine.unpriced)
    return total


# Every profile has a daily budget by default (TERRET_PROFILE_DAILY_*), so
# this read runs before every model step: one hand-written statement, not the
# ORM's aggregate, which cost about 1 ms of CPU per step to build (bench/turns.py).
# It sums the profile's shard rows (at most TERRET_TALLY_SHARDS, read from
# the (day, profile, shard) unique index).
_DAY_SUMS = (
    "SELECT COALESCE(SUM(cost), 0), COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), "
    "COALESCE(SUM(steps), 0), COALESCE(SUM(turns), 0), COALESCE(SUM(unpriced_entries), 0) "
    f"FROM {UsageDay._meta.db_table} WHERE day = %s"
)
_COST_PLACES = Decimal(1).scaleb(-UsageDay._meta.get_field("cost").decimal_places)  # type: ignore[union-attr]


def day_spent(profile_id: int | None = None) -> Spent:
    """Today's (UTC) spend of one profile, or of everything (None)."""
    sql, params = _DAY_SUMS, list[Any]([timezone.now().date()])
    if profile_id is not None:
        sql, params = sql + " AND profile_id = %s", [*params, profile_id]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        cost, prompt, completion, steps, turns, unpriced = cursor.fetchone()
    # SQLite sums a decimal column as a float: back to the column's places.
    cost = cost if isinstance(cost, Decimal) else Decimal(str(cost)).quantize(_COST_PLACES)
    return Spent(cost, int(prompt) + int(completion), int(steps), int(turns), int(unpriced))


def first_exceeded(
    scope: str, limits: dict[str, Decimal | int | None], spent: Spent, *, opening: bool
) -> Exceeded | None:
    for name in BUDGETS:
        limit = limits.get(name)
        if limit is None:
            continue
        if name == "cost_usd" and spent.unpriced and limits.get("tokens") is None:
            return Exceeded(name, scope, limit, spent.cost_usd, spent.unpriced)
        used = spent.of(name)
        if name in ("cost_usd", "tokens"):
            over = used >= limit
        elif name == "steps":
            over = used + 1 > limit
        else:
            over = used + (1 if opening else 0) > limit
        if over:
            return Exceeded(name, scope, limit, used)
    return None


def check(
    session_id: uuid.UUID | str,
    profile: AgentProfile | None,
    *,
    opening: bool,
    budgeted: bool = True,
    pending: Spent = NOTHING,
    parent: Any = UNREAD,
) -> Exceeded | None:
    """The first exhausted budget for the next action, session first, then
    the profile's day, then the installation's day; None when all allow it.
    `budgeted=False` (the session has no budget of its own, as the caller
    knows) skips the session row's read; `pending` is spend committed by
    none of them yet (buffered); `parent` is the session's parent_session_id
    when the caller read its row (ancestors)."""
    if budgeted:
        spent, limits = session_spent(session_id)
        if _any(limits):
            spent += children_spent(session_id)  # a subagent's spend is its parent's too
            found = first_exceeded("session", limits, spent + pending, opening=opening)
            if found:
                return found
    # A parent's budget exhausted (its children's spend counted) holds its whole tree.
    for ancestor in ancestors(session_id, parent):
        spent, limits = session_spent(ancestor)
        tree = {name: limits[name] for name in TREE_BUDGETS}
        if _any(tree):
            found = first_exceeded("session", tree, spent + children_spent(ancestor) + pending, opening=False)
            if found:
                return found
    profile_limits = limits_of_profile(profile)
    if profile is not None and _any(profile_limits):
        found = first_exceeded("profile", profile_limits, day_spent(profile.pk) + pending, opening=opening)
        if found:
            return found
    limits = global_limits()
    if _any(limits):
        return first_exceeded("global", limits, day_spent(None) + pending, opening=opening)
    return None
