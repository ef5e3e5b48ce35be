"""The one rule of who may touch a session, for every door.

`session_for(user, session_id, need)` is asked first by every action, so the
web pages, the JSON API, the socket frames and /lg/ give the same answer to
the same question:

- a session that does not exist, or that the user may not view (a foreign
  id), is `UnknownSession` (404 on every door), so ids cannot be probed;
- one the user may view but not do `need` to is `NotAllowed` (403).

`need` is one of view, drive, approve, resolve, operate (sessions_app.
permissions says who may each). Operators' actions on no session (the
console's attention list, suspending a profile) ask `operator(user)`, the
reviewers' queue `reviewer(user)`, and a list of sessions is cut by
`visible(user, queryset)`: the same rule, in the form each needs.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from django.db.models import QuerySet

from sessions_app.errors import NotAllowed, UnknownSession
from sessions_app.models import Session
from sessions_app.permissions import (
    can_approve,
    can_drive,
    can_resolve,
    can_view,
    is_operator,
    is_reviewer,
    owner_may_resolve,
    visible_sessions,
)
from sessions_app.services import storage

Need = Literal["view", "drive", "approve", "resolve", "operate"]

_REFUSALS: dict[str, str] = {
    "drive": "only the session's owner or staff may do that",
    "approve": "deciding approvals needs the approve permission",
    "operate": "operators' actions need staff",
}


def parse_session_id(value: Any) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise UnknownSession(f"no session {str(value)[:64]!r}") from None


def allowed(user: Any, session: Session, need: Need) -> bool:
    """May `user` do `need` to `session`, which they may view."""
    if need == "view":
        return can_view(user, session)
    if need == "drive":
        return can_drive(user, session)
    if need == "approve":
        return can_approve(user, session)
    if need == "resolve":
        return can_resolve(user, session)
    return is_operator(user)


def session_for(user: Any, session_id: Any, need: Need, *, thaw: bool = True) -> Session:
    """The session, if `user` may do `need` to it (see the module docstring).
    A cold session (docs/storage.md, "Tiering") is read back first, so what
    the caller does next meets its whole log; `thaw=False` for a caller that
    reads only the session row (its detail, its storage)."""
    sid = parse_session_id(session_id)
    session = Session.objects.select_related("profile", "owner", "agent").filter(id=sid).first()
    if session is None or not can_view(user, session):
        raise UnknownSession(f"no session {sid}")
    if not allowed(user, session, need):
        raise NotAllowed(_refusal(need))
    if thaw and session.storage_tier == "cold" and storage.ensure_hot(sid):
        session.refresh_from_db()
    return session


def operator(user: Any) -> None:
    """Operators' actions that name no session (attention, suspend, resume)."""
    if not is_operator(user):
        raise NotAllowed(_REFUSALS["operate"])


def reviews(user: Any) -> bool:
    """Whether `user` may decide approvals (the reviewers' queue and its count)."""
    return is_reviewer(user)


def reviewer(user: Any) -> None:
    """The reviewers' queue (every session's parked calls the user may decide)."""
    if not reviews(user):
        raise NotAllowed(_REFUSALS["approve"])


def sees_all(user: Any) -> bool:
    """Whether `user` may view every session (staff and reviewers), not only
    their own: the lists show an owner column then."""
    return bool(user and user.is_authenticated and user.is_active and (user.is_staff or is_reviewer(user)))


def visible(user: Any, queryset: QuerySet[Session]) -> QuerySet[Session]:
    """`queryset` cut to the sessions `user` may view: the lists' form of
    session_for's "view" (permissions.visible_sessions)."""
    return visible_sessions(user, queryset)  # type: ignore[no-any-return]


def _refusal(need: Need) -> str:
    if need == "resolve":
        return "resolving an effect of unknown outcome needs staff" + (
            "" if owner_may_resolve() else " (owners may not: TERRET_OWNER_MAY_RESOLVE is off)"
        )
    return _REFUSALS.get(need, "not allowed")


def by(user: Any) -> str:
    """Who did it, as the log records it."""
    return str(user.get_username())
