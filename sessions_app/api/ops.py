"""What a caller may do to a session through the program interface.

The HTTP views and the socket consumer are thin: they validate the shape of a
request, then call one function here with the authenticated user. Each
function checks permission (sessions_app.permissions), calls one service and
returns a JSON-ready dict. Failures are TerretErrors (see api/errors.py).

A session the user may not view is reported exactly like a missing one, so
ids cannot be probed; one the user may view but not act on is `not_allowed`.

Operators' actions (the console: attention, suspend, resume, abandon,
revoke, restore) are for active staff only (`permissions.is_operator`);
anyone else gets `not_allowed` before any lookup, so ids cannot be probed.

Resolving an effect of unknown outcome (`resolve`) is an operator's call:
staff, and the session's owner only where TERRET_OWNER_MAY_RESOLVE is on
(`permissions.can_resolve`, which the session page asks too).
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from django.db.models import QuerySet

from approvals_app import selectors as approvals
from approvals_app import services as approval_services
from policies_app import services as policy_services
from sessions_app import services
from sessions_app.api.errors import NotAllowed, UnknownSession
from sessions_app.errors import InvalidInput
from sessions_app.log.reads import blocked_info, events_page, usage, waiting_info
from sessions_app.models import AgentProfile, Session
from sessions_app.permissions import can_approve, can_drive, can_resolve, can_view, is_operator, owner_may_resolve
from sessions_app.services import budgets as budget_services
from sessions_app.services import compaction, inputs, operators, schedules
from sessions_app.services import effects as effect_services
from sessions_app.services import forks as fork_services

Need = Literal["view", "drive", "approve", "resolve"]


def parse_session_id(value: Any) -> uuid.UUID:
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise UnknownSession(f"no session {str(value)[:64]!r}") from None


def session_for(user: Any, session_id: Any, need: Need) -> Session:
    """The session, if `user` may do `need` to it."""
    sid = parse_session_id(session_id)
    session = Session.objects.select_related("profile").filter(id=sid).first()
    if session is None or not can_view(user, session):
        raise UnknownSession(f"no session {sid}")
    if need == "drive" and not can_drive(user, session):
        raise NotAllowed("only the session's owner or staff may do that")
    if need == "approve" and not can_approve(user, session):
        raise NotAllowed("deciding approvals needs the approve permission")
    if need == "resolve" and not can_resolve(user, session):
        raise NotAllowed(
            "resolving an effect of unknown outcome needs staff"
            + ("" if owner_may_resolve() else " (owners may not: TERRET_OWNER_MAY_RESOLVE is off)")
        )
    return session


def _by(user: Any) -> str:
    return str(user.get_username())


# ---------------------------------------------------------------- profiles and sessions


def usable_profiles(user: Any) -> QuerySet[AgentProfile]:
    """Profiles `user` may start sessions with. Profiles carry no access
    rules yet, so any active user may use every profile."""
    if not (user and user.is_authenticated and user.is_active):
        return AgentProfile.objects.none()
    return AgentProfile.objects.order_by("name")


def list_profiles(user: Any) -> dict[str, Any]:
    rows = usable_profiles(user).values("name", "description")
    return {"profiles": [{"name": r["name"], "description": r["description"]} for r in rows]}


def create_session(user: Any, profile: str) -> dict[str, Any]:
    found = usable_profiles(user).filter(name=profile).first()
    if found is None:
        raise InvalidInput(f"unknown profile {profile[:64]!r}; GET /api/profiles lists yours")
    session = services.create_session(user, found)
    return {"id": str(session.id), "profile": found.name, "status": session.status}


def _iso(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {**info, "since": info["since"].isoformat()}


def health(session: Session) -> dict[str, Any]:
    """status, and `blocked` {reason, attempts, since} / `waiting` {reason,
    since} (each None unless the session is in that state), and the open
    turn's count of unresolved attempts of unknown outcome, JSON-ready."""
    return {
        "status": session.status,
        "blocked": _iso(blocked_info(session)),
        "waiting": _iso(waiting_info(session)),
        "unknown_effects": session.unknown_effects,
    }


def session_detail(user: Any, session_id: Any) -> dict[str, Any]:
    session = session_for(user, session_id, "view")
    totals = usage(session)
    return {
        "id": str(session.id),
        "profile": session.profile.name if session.profile else None,
        **health(session),
        "title": session.title,
        "usage": {
            "prompt_tokens": totals["prompt_tokens"],
            "completion_tokens": totals["completion_tokens"],
            "cost": float(totals["cost"]),
            "steps": totals["steps"],
            "unpriced": totals["unpriced"],
        },
        "last_seq": session.last_seq,
        "pending_approvals": [{**p.as_json(), "seq": p.seq} for p in approvals.pending(session.id)],
        "budget": budget_services.budget_of(session.id),
    }


def socket_access(user: Any, session_id: Any) -> dict[str, Any]:
    """What a socket for this session may do (raises like session_for)."""
    session = session_for(user, session_id, "view")
    return {"session": session.id, "can_drive": can_drive(user, session), "can_approve": can_approve(user, session)}


def head(session_id: uuid.UUID) -> int:
    value = Session.objects.filter(id=session_id).values_list("last_seq", flat=True).first()
    if value is None:
        raise UnknownSession(f"no session {session_id}")
    return int(value)


def live_state(session_id: uuid.UUID) -> dict[str, Any]:
    """The log head and the session's health (see `health`), from one read of
    the session row, so the status describes the log exactly up to last_seq."""
    session = Session.objects.filter(id=session_id).first()
    if session is None:
        raise UnknownSession(f"no session {session_id}")
    return {"last_seq": session.last_seq, **health(session)}


def events(user: Any, session_id: Any, after: int, limit: int) -> dict[str, Any]:
    session = session_for(user, session_id, "view")
    page = events_page(session.id, after, limit)
    # Read the head after the page, so last_seq >= every seq returned.
    return {"events": page, "last_seq": head(session.id)}


def effects(user: Any, session_id: Any) -> dict[str, Any]:
    """The session's effect ledger: every attempt, oldest first, and how many
    wait for an operator (state unknown)."""
    session = session_for(user, session_id, "view")
    rows = effect_services.effects(session.id)
    return {"effects": [e.as_json() for e in rows], "pending": sum(1 for e in rows if e.state == "unknown")}


def budget(user: Any, session_id: Any) -> dict[str, Any]:
    """The session's limits, its spend, and the first budget at any scope
    (session, profile per UTC day, global per UTC day) that keeps a new turn
    from starting (`exhausted`, None when none does)."""
    session = session_for(user, session_id, "view")
    return budget_services.budget_of(session.id)


def budget_state(session_id: uuid.UUID) -> dict[str, Any]:
    """`budget` for a socket that was allowed to read the session already."""
    return budget_services.budget_of(session_id)


# ---------------------------------------------------------------- actions


def inject(
    user: Any,
    session_id: Any,
    text: str,
    wake: bool = True,
    idempotency_key: str | None = None,
    *,
    lane: Any = None,
    multitask_strategy: Any = None,
) -> dict[str, Any]:
    session = session_for(user, session_id, "drive")
    receipt = services.inject(
        session.id,
        text,
        wake=wake,
        by=_by(user),
        idempotency_key=idempotency_key,
        lane=lane,
        multitask_strategy=multitask_strategy,
    )
    return receipt.as_json()


def input_receipt(user: Any, session_id: Any, seq: int) -> dict[str, Any]:
    session = session_for(user, session_id, "view")
    return inputs.receipt(session.id, seq).as_json()


def withdraw(user: Any, session_id: Any, seq: int) -> dict[str, Any]:
    session = session_for(user, session_id, "drive")
    return inputs.withdraw(session.id, seq, by=_by(user)).as_json()


def list_schedules(user: Any, session_id: Any) -> dict[str, Any]:
    session = session_for(user, session_id, "view")
    return {"schedules": [schedules.as_json(s) for s in schedules.of_session(session.id)]}


def create_schedule(user: Any, session_id: Any, body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    session = session_for(user, session_id, "drive")
    made, new = schedules.create(session.id, body, by=_by(user))
    return schedules.as_json(made), new


def cancel_schedule(user: Any, session_id: Any, schedule_id: str) -> dict[str, Any]:
    session = session_for(user, session_id, "drive")
    return schedules.as_json(schedules.cancel(session.id, schedule_id, by=_by(user)))


def decide(
    user: Any,
    session_id: Any,
    call_id: str,
    verdict: str,
    reason: str | None = None,
    request_seq: int | None = None,
    *,
    edited_args: dict[str, Any] | None = None,
    allow_for_session: bool = False,
) -> dict[str, Any]:
    session = session_for(user, session_id, "approve")
    event = approval_services.decide(
        session.id,
        call_id,
        verdict,
        user=user,
        reason=reason or "",
        request_seq=request_seq,
        edited_args=edited_args,
        allow_for_session=allow_for_session,
    )
    return {
        "call_id": event.data["call_id"],
        "verdict": event.data["verdict"],
        "seq": event.seq,
        "edited_args": event.data.get("edited_args"),
        "allowed_for_session": allow_for_session,
    }


def set_policy(user: Any, session_id: Any, patterns: list[str]) -> dict[str, Any]:
    session = session_for(user, session_id, "drive")
    event = policy_services.update_policy(session.id, patterns, user=user)
    return {"patterns": event.data["patterns"], "seq": event.seq}


def cancel(user: Any, session_id: Any) -> dict[str, Any]:
    """Cancel the open turn. `closed`: it has already ended (no worker held
    it, so the cancel closed it at once); otherwise the worker driving it
    stops its model stream within about a second."""
    session = session_for(user, session_id, "drive")
    cancelled = services.cancel(session.id, by=_by(user))
    closed = False
    if cancelled:
        row = Session.objects.filter(id=session.id).values_list("open_turn_seq", "cancel_seq").first()
        # turn/end clears cancel_seq: an open turn without one is a later turn, so ours has ended.
        closed = row is None or row[0] is None or row[1] is None
    return {"cancelled": cancelled, "closed": closed}


def retry(user: Any, session_id: Any) -> dict[str, Any]:
    """Drive a blocked turn again now (NotBlocked, 409, when it is not blocked)."""
    session = session_for(user, session_id, "drive")
    services.retry(session.id, by=_by(user))
    fresh = Session.objects.filter(id=session.id).first()
    return {"status": (fresh or session).status}


def resolve(
    user: Any, session_id: Any, call_id: str, action: str, result: str | None = None, reason: str | None = None
) -> dict[str, Any]:
    """Answer the newest unknown attempt of `call_id` (effect_services.resolve):
    the attempt as it was, and the session's status after it."""
    session = session_for(user, session_id, "resolve")
    effect = effect_services.resolve(
        session.id, call_id, action, result=result or "", reason=reason or "", by=_by(user)
    )
    fresh = Session.objects.filter(id=session.id).first()
    return {"resolved": effect.as_json(), "status": (fresh or session).status}


def set_budget(user: Any, session_id: Any, values: dict[str, Any]) -> dict[str, Any]:
    """Replace the session's four limits (budget/updated; null: no limit);
    the budget as `budget` reads it afterwards."""
    session = session_for(user, session_id, "drive")
    budget_services.set_budget(session.id, values, by=_by(user))
    return budget_services.budget_of(session.id)


def compact(user: Any, session_id: Any) -> dict[str, Any]:
    """Compact now. Runs the summarizer in the caller's thread (seconds)."""
    session = session_for(user, session_id, "drive")
    outcome = compaction.attempt(session.id, manual=True)
    if isinstance(outcome, compaction.CompactionResult):
        return {"compacted": True, "seq": outcome.seq, "upto_seq": outcome.upto_seq, "reason": None}
    return {"compacted": False, "seq": None, "upto_seq": None, "reason": outcome.reason}


def set_model(user: Any, session_id: Any, role: str, spec: str) -> dict[str, Any]:
    session = session_for(user, session_id, "drive")
    event = services.set_model(session.id, role, spec, by=_by(user))
    return {"role": event.data["role"], "spec": event.data["spec"], "seq": event.seq}


def fork(user: Any, session_id: Any, at_seq: int, policy: str) -> dict[str, Any]:
    """A new session of the caller's from the parent's log as of at_seq
    (services/forks.py); reading the parent is enough."""
    parent = session_for(user, session_id, "view")
    child = fork_services.fork(parent.id, at_seq, policy, user=user)
    return fork_json(child)


def fork_json(child: Session) -> dict[str, Any]:
    origin = fork_services.forked_from(child.id) or {}
    return {
        "id": str(child.id),
        "profile": child.profile.name if child.profile else None,
        "status": child.status,
        "parent": origin.get("parent"),
        "at_seq": origin.get("at_seq"),
        "requested_seq": origin.get("requested_seq"),
        "policy": origin.get("policy"),
        "last_seq": child.last_seq,
    }


# ---------------------------------------------------------------- operators (staff)


def _operator(user: Any) -> None:
    if not is_operator(user):
        raise NotAllowed("operators' actions need staff")


def attention(user: Any) -> dict[str, Any]:
    """What needs a human, by kind (operators.attention), and how many of each."""
    _operator(user)
    found = operators.attention()
    return {
        "attention": {kind: [item.as_json() for item in items] for kind, items in found.items()},
        "counts": {kind: len(items) for kind, items in found.items()},
    }


def suspend(user: Any, scope: str, target: str, reason: str) -> dict[str, Any]:
    _operator(user)
    operators.suspend(scope, target, by=_by(user), reason=reason)
    return {"ok": True, "woken": None}


def resume(user: Any, scope: str, target: str, reason: str) -> dict[str, Any]:
    _operator(user)
    woken = operators.resume(scope, target, by=_by(user), reason=reason)
    return {"ok": True, "woken": woken}


SESSION_ACTIONS = {
    "abandon": operators.abandon,
    "revoke": operators.revoke,
    "restore": operators.restore,
}


def session_action(user: Any, session_id: Any, action: str, reason: str) -> dict[str, Any]:
    """abandon (a blocked turn, NotAbandonable 409 otherwise), revoke or restore."""
    _operator(user)
    sid = parse_session_id(session_id)
    SESSION_ACTIONS[action](sid, by=_by(user), reason=reason)
    fresh = Session.objects.filter(id=sid).first()
    if fresh is None:
        raise UnknownSession(f"no session {sid}")
    return {"ok": True, "status": fresh.status}
