"""Sessions: profiles to start from, a new session, its detail and health,
the log's events, and driving it (cancel, retry, compact, a model role)."""

from __future__ import annotations

import uuid
from typing import Any

from django.db.models import QuerySet

from approvals_app import selectors as approvals
from sessions_app import services
from sessions_app.actions.access import by, session_for
from sessions_app.errors import InvalidInput, UnknownSession
from sessions_app.log.reads import blocked_info, events_page, stalled_since, usage, waiting_info
from sessions_app.models import AgentProfile, Session
from sessions_app.permissions import can_approve, can_drive
from sessions_app.services import budgets as budget_services
from sessions_app.services import compaction
from sessions_app.services import sessions as session_services
from sessions_app.services.operators import turn_progress


def usable_profiles(user: Any) -> QuerySet[AgentProfile]:
    """Profiles `user` may start sessions with. Profiles carry no access
    rules yet, so any active user may use every profile."""
    if not (user and user.is_authenticated and user.is_active):
        return AgentProfile.objects.none()
    return AgentProfile.objects.order_by("name")


def list_profiles(user: Any) -> dict[str, Any]:
    rows = usable_profiles(user).values("name", "description")
    return {"profiles": [{"name": r["name"], "description": r["description"]} for r in rows]}


def create_session(user: Any, profile: str) -> Session:
    """A new session of `user`'s from the profile named `profile`."""
    found = usable_profiles(user).filter(name=profile).first()
    if found is None:
        raise InvalidInput(f"unknown profile {profile[:64]!r}; GET /api/profiles lists yours")
    return services.create_session(user, found)


def _iso(info: dict[str, Any] | None) -> dict[str, Any] | None:
    if info is None:
        return None
    return {**info, "since": info["since"].isoformat()}


def health(session: Session) -> dict[str, Any]:
    """status, and `blocked` {reason, attempts, since} / `waiting` {reason,
    since} (each None unless the session is in that state), the open
    turn's count of unresolved attempts of unknown outcome, and
    `stalled_since` (None unless its turn/stalled stands), JSON-ready."""
    stalled = stalled_since(session)
    return {
        "status": session.status,
        "blocked": _iso(blocked_info(session)),
        "waiting": _iso(waiting_info(session)),
        "unknown_effects": session.unknown_effects,
        "stalled_since": stalled.isoformat() if stalled else None,
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
        "progress": turn_progress(session).as_json(),
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
    """A page of the log after `after`: at most `limit` events and at most
    TERRET_READ_MAX_BYTES of them (log.reads.events_page); `next_after` is
    where the next page starts (None when this one reached the head)."""
    session = session_for(user, session_id, "view")
    page = events_page(session.id, after, limit)
    # Read the head after the page, so last_seq >= every seq returned.
    last_seq = head(session.id)
    tail = page[-1]["seq"] if page else after
    return {"events": page, "last_seq": last_seq, "next_after": tail if tail < last_seq else None}


def cancel(user: Any, session_id: Any) -> dict[str, Any]:
    """Cancel the open turn. `closed`: it has already ended (no worker held
    it, so the cancel closed it at once); otherwise the worker driving it
    stops its model stream within about a second."""
    session = session_for(user, session_id, "drive")
    cancelled = services.cancel(session.id, by=by(user))
    closed = False
    if cancelled:
        row = Session.objects.filter(id=session.id).values_list("open_turn_seq", "cancel_seq").first()
        # turn/end clears cancel_seq: an open turn without one is a later turn, so ours has ended.
        closed = row is None or row[0] is None or row[1] is None
    return {"cancelled": cancelled, "closed": closed}


def retry(user: Any, session_id: Any) -> dict[str, Any]:
    """Drive a blocked turn again now (NotBlocked, 409, when it is not blocked)."""
    session = session_for(user, session_id, "drive")
    services.retry(session.id, by=by(user))
    fresh = Session.objects.filter(id=session.id).first()
    return {"status": (fresh or session).status}


def compact(user: Any, session_id: Any) -> dict[str, Any]:
    """Compact now. Runs the summarizer in the caller's thread (seconds)."""
    session = session_for(user, session_id, "drive")
    outcome = compaction.attempt(session.id, manual=True)
    if isinstance(outcome, compaction.CompactionResult):
        return {"compacted": True, "seq": outcome.seq, "upto_seq": outcome.upto_seq, "reason": None}
    return {"compacted": False, "seq": None, "upto_seq": None, "reason": outcome.reason}


def set_model(user: Any, session_id: Any, role: str, spec: str) -> dict[str, Any]:
    session = session_for(user, session_id, "drive")
    event = services.set_model(session.id, role, spec, by=by(user))
    return {"role": event.data["role"], "spec": event.data["spec"], "seq": event.seq}


def rename(user: Any, session_id: Any, title: str) -> int:
    """A new title by the user (session/titled; the latest wins): its seq."""
    session = session_for(user, session_id, "drive")
    return session_services.rename_session(session.id, title, by=by(user)).seq


def archive(user: Any, session_id: Any) -> Session:
    """Hide the session from the list and dispose of its agent."""
    session = session_for(user, session_id, "drive")
    return session_services.archive_session(session.id, by=by(user))


def unarchive(user: Any, session_id: Any) -> Session:
    session = session_for(user, session_id, "drive")
    return session_services.unarchive_session(session.id, by=by(user))
