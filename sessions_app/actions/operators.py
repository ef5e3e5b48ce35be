"""Operators' actions (the console): what needs a human, suspending and
resuming a scope, and abandon, revoke or restore of one session. Active
staff only: `operator(user)` for a scope, `session_for(.., "operate")` for a
session (a foreign or missing id is a 404 like on every other action)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sessions_app.actions.access import by, operator, reviews, session_for
from sessions_app.actions.approvals import Decision, decide
from sessions_app.actions.sessions import StatusAfter, status_now
from sessions_app.actions.words import status_label
from sessions_app.models import Session
from sessions_app.services import fleet as fleet_reads
from sessions_app.services import operators
from sessions_app.services.fleet import Line as TimelineLine
from sessions_app.services.fleet import LiveTurn, Row
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


@dataclass(frozen=True)
class Fleet:
    """The live fleet view: the turns running now, and the session table as filtered and sorted."""

    running: list[LiveTurn]
    rows: list[Row]
    status: str
    sort: str
    may_decide: bool  # the operator is a reviewer too: approvals get their buttons

    filters = [(name, label) for name, (label, _) in fleet_reads.FILTERS.items()]
    sorts = [(name, label) for name, (label, _) in fleet_reads.SORTS.items()]

    def as_json(self) -> dict[str, Any]:
        return {
            "running": [t.as_json() for t in self.running],
            "sessions": [{"id": str(r.session.id), "status": r.status, "cost": r.cost} for r in self.rows],
            "status": self.status,
            "sort": self.sort,
        }


def fleet(user: Any, status: str = "all", sort: str = "recent") -> Fleet:
    operator(user)
    rows, status, sort = fleet_reads.table(status, sort)
    labelled = [replace(r, label=status_label(r.status)) for r in rows]
    return Fleet(fleet_reads.running_now(), labelled, status, sort, reviews(user))


def decide_approval(user: Any, session_id: Any, call_id: str, verdict: str, reason: str = "") -> Decision:
    """An operator's verdict from the console: the reviewers' decide verb (its
    own checks: a reviewer who may see the session), recorded in the
    operators' log with its actor too."""
    operator(user)
    decision = decide(user, session_id, call_id, verdict, reason)
    operators.record_decision(by(user), session_id, decision.verdict, call_id, reason)
    return decision


def free_held(user: Any, session_id: Any, reason: str = "") -> str:
    """Free a session's held input (its own suspension or budget): what was done."""
    session = session_for(user, session_id, "operate")
    return operators.free_held(session.id, by=by(user), reason=reason)


@dataclass(frozen=True)
class Timeline:
    session: Session
    lines: list[TimelineLine]
    after: int

    @property
    def next_after(self) -> int | None:
        """Where the next page starts, when this one was full."""
        return self.lines[-1].seq if len(self.lines) >= fleet_reads.TIMELINE_PAGE else None


def timeline(user: Any, session_id: Any, after: int = 0) -> Timeline:
    """A session's events as a compact history, for the operator who must find out what happened."""
    session = session_for(user, session_id, "operate")
    return Timeline(session, fleet_reads.timeline(session.id, max(0, after)), after)
